"""The details' templates of the claims measured on a run: timings, trained models, SmolLM2 past its
context (details_text.py says how they are filled), and the quick run's reasons to read a verdict
as indicative only."""

MEASURED = {
    # timings (lab.timed)
    "ratio":
        "Median of {rounds} per-round ratios {median:.3f}, 95% interval of the median {low:.3f}-{high:.3f} "
        "(bootstrap over rounds), per-round spread ± {spread:.3f}.",
    "ratio unsettled":
        "The per-round spread is at least the effect, or the median's interval holds 1, so the sign of the effect is "
        "not settled on this machine.",
    "ratio in band": "The median's interval meets {low:g}-{high:g}.",
    "ratio outside band":
        "The median's interval lies outside {low:g}-{high:g}: on this CPU, measured like for like, the effect has "
        "another size.",
    "ratio above": "The median's interval meets the band above {low:g}.",
    "ratio not above": "The median's interval lies below {low:g}: on this CPU the effect has the other direction.",
    "15.3.speed-six-ops":
        "this CPU, one thread, (2048, 512) float32, warm: LayerNorm {layernorm:.3f} ms, six-op RMSNorm "
        "{six_op:.3f} ms (medians). Like the module's, this compares one fused kernel with six separate ones, not the "
        "saved pass; the size of the ratio is the hardware's, only its direction is judged.",
    "15.3.speed-fused":
        "2048 rows, float32, one thread, warm, {rounds} interleaved rounds per width; llamablock.norm.rms_norm "
        "against a three-pass LayerNorm, both torch.compile'd (inductor). torch's one-pass F.layer_norm is timed "
        "beside: it has no separate mean pass, so it does not test the claim. Per width:",
    "15.3.speed-fused width":
        "d {width}: median of {rounds} per-round ratios {median:.3f}, 95% interval of the median "
        "{low:.3f}-{high:.3f}, per-round spread ± {spread:.3f}.",
    "15.3.speed-fused differs": "At width {widths} the median's interval lies outside 0.85-0.90.",
    "15.3.speed-fused reproduced": "At every width the median's interval meets 0.85-0.90.",
    "15.3.speed-fused unmeasurable":
        "At width {widths} the per-round spread is at least the effect or the median's interval holds 1, and no "
        "width lies outside the band.",
    "15.3.speed-fused quick":
        "quick run: {widths} widths and {rounds} rounds each; `llamablock lab` times {full_widths} widths with "
        "{full_rounds} rounds",
    "15.5.decode-speed":
        "float32, this CPU, one thread, K/V of {tokens} tokens x 128 per head (L3 {l3}): llamablock's grouped "
        "attention fits time = {a_ms:.3f} ms + {ms_per_mib:.4f} ms per MiB of cache (worst residual {residual:.1%} "
        "of a time), so the bytes-proportional part is {share:.1%} of the time at 8 KV heads and {share32:.1%} at 32 "
        "(the precondition: over half at 8). Under that fit the 32 -> 8 ratio is 1 + 3 x {share:.3f} = "
        "{fit_ratio:.2f}. A plain read (a sum) of the same caches in the same rounds: {read_share:.1%} "
        "bytes-proportional at 8 heads, 32 -> 8 ratio {read_ratio:.2f}x; attention takes {vs_read:.2f}x its read at "
        "32 heads (it also multiplies every byte it reads, so it is slower than a sum).",
    "15.5.decode-speed misses":
        "Plain reads of these caches follow their bytes, so this machine is in the claim's regime, but the "
        "attention's time does not (32 -> 8: {ratio:.2f}x): this implementation does not turn the smaller cache "
        "into less time.",
    "15.5.decode-speed regime":
        "Neither the attention nor a plain read of its cache spends most of its time in proportion to the bytes here "
        "(fixed costs dominate), so the claim's regime, reading the cache as the bottleneck, is not reached on this "
        "machine.",
    "15.5.decode-speed quick": "quick run: {rounds} interleaved rounds; `llamablock lab` times {full_rounds}",
    "15.5.decode-share":
        "float32, one thread, {rounds} interleaved rounds; at 32 KV heads and 8,192 tokens the cache takes "
        "{share:.3f} of the step (95% interval of the median {low:.3f}-{high:.3f});",
    "15.5.decode-share heads": "32 vs 8 KV heads: share difference {diff:+.3f} ({low:+.3f} to {high:+.3f});",
    "15.5.decode-share tokens": "32,768 vs 8,192 tokens: share difference {diff:+.3f} ({low:+.3f} to {high:+.3f});",
    "15.5.decode-share bytes":
        "the bytes share is the cache's part of the bytes the step reads (float32 cache and weights).",
    "15.5.decode-share not much": "The share is below {much:g}.",
    "15.5.decode-share not rising": "The share does not grow as the cache does.",
    "15.5.decode-share quick":
        "quick run: 8,192 tokens only and {rounds} rounds; `llamablock lab` adds 32,768 tokens and times {full_rounds}",
    # trained models (lab.shared, exp_training, benefits, exp_norm_parts, exp_beyond)
    "quick trained":
        "quick run: one seed, {steps} steps of a {layers}-layer width-{width} model; `llamablock lab` trains "
        "{full_layers} layers of width {full_width} for {full_steps} steps with {full_seeds:seeds}",
    "noise one seed": "Noise: twice the paired standard error over the evaluation windows (one seed).",
    "noise seeds": "Noise: the larger of 2 sd between seeds and twice the paired window standard error.",
    "compare":
        "{name}: {loss:loss} vs {base}: {base_loss:loss} nats/char ({params:,} vs {base_params:,} parameters); noise "
        "threshold {noise:.4f}.",
    "15.3.training-quality":
        "Placement held fixed (both post-LN). Moving RMSNorm before each sub-layer as well (pre-LN): {pre:loss}, "
        "{pre_delta:+.4f} against post-LN RMSNorm: that part is the placement's, not the dropped mean's.",
    "15.3.training-quality worse": "RMSNorm worse by {delta:+.4f}, beyond the noise {noise:.4f}, after {steps} steps.",
    "15.4.training-quality": "GELU at the same budget: {gelu:loss}; {steps} steps.",
    "15.4.training-quality not lower":
        "SwiGLU minus ReLU {relu:+.4f}, minus GELU {gelu:+.4f}: above an ungated layer by more than {noise:.4f}.",
    "15.4.training-quality unsettled":
        "SwiGLU minus ReLU {relu:+.4f}, minus GELU {gelu:+.4f}, noise {noise:.4f}: not lower than both beyond the "
        "noise, nor above either beyond it, so 'lower than ReLU and GELU' is not settled at this size.",
    "15.5.training-quality":
        "MQA (one KV head) against GQA: {mqa:+.4f}, noise threshold {noise:.4f}. Pairs of query heads share a KV "
        "head; the saved parameters go to a wider feed-forward layer (equal budget).",
    "15.5.training-quality not close": "GQA is not within the noise of MHA.",
    "15.5.training-quality mqa better": "MQA trained better than GQA by more than the noise.",
    "15.5.training-quality size": "{steps} steps of {params:,}-parameter models.",
    "15.5.training-quality unsettled":
        "GQA is within the noise of MHA, but MQA and GQA are within the noise of each other, so 'better than MQA' "
        "is not settled at this size.",
    "15.6.training-stability":
        "both blocks at lr 1e-2 (ten times the ablation's) with warm-up over 10% of the steps instead of 40%: 2017 "
        "{old:loss} ({old_rise:+.4f} against lr 1e-3), 2024 {new:loss} ({new_rise:+.4f}); noise threshold "
        "{noise:.4f}. Post-LN is the known fragile part (Xiong et al. 2020): it needs a long warm-up, pre-LN does "
        "not.",
    "15.6.ablation": "{steps} steps, {seeds:seeds}, equal parameters; per change, in the table:",
    "15.6.ablation RMSNorm pre-LN":
        "RMSNorm pre-LN (loss rise at lr 1e-2 minus the 2017 block's) {value:+.4f}, noise {noise:.4f}: {verdict};",
    "15.6.ablation GQA": "GQA (KV bytes per token, GQA / 2017) {value:.4f}: {verdict};",
    "15.6.ablation SwiGLU": "SwiGLU (loss change) {value:+.4f}, noise {noise:.4f}: {verdict};",
    "15.6.ablation rest":
        "GQA's loss change {gqa:+.4f} (noise {gqa_noise:.4f}). The whole 2024 block against the 2017 one: "
        "{whole:+.4f} (noise {whole_noise:.4f}), shown, not judged.",
    "15.6.ablation differs": "Not every judged change shows its benefit: {changes}.",
    "15.6.ablation unsettled": "Within the noise: {changes}.",
    "15.5.mha-to-gqa":
        "a {layers}-layer width-{width} model with {heads} KV heads trained {steps} steps (val {mha:.4f}; "
        "{mha_more:.4f} after {uptrain} more steps), its key and value heads averaged in pairs into 2 (GQA, Ainslie "
        "et al.'s mean-pooling): {pooled_start:.4f} right after conversion, {pooled_end:.4f} after {uptrain} steps "
        "({share:.0%} of the original; Ainslie et al. use 5%). Control, key/value heads re-initialised: "
        "{control_start:.4f}, then {control_end:.4f}. Paired over the {windows} evaluation windows the control ends "
        "{above:+.4f} above the mean-pooled model, noise margin {margin:.4f} (2 standard errors). One seed.",
    "15.5.mha-to-gqa nothing to recover": "Not reproduced: the conversion cost nothing to recover.",
    "15.5.mha-to-gqa half": "Not reproduced: uptraining recovered less than half the penalty.",
    "15.5.mha-to-gqa control":
        "Not reproduced: the re-initialised control ended within the noise margin of it (or below it), so the "
        "averaging did not show to matter at this size.",
    "15.5.mha-to-gqa quick":
        "quick run: one seed, {steps} steps of a {layers}-layer width-{width} model, {uptrain} uptraining steps; "
        "`llamablock lab` trains {full_layers} layers of width {full_width} for {full_steps}",
    "15.3.division-stabilizes":
        "{steps} steps at lr {lr:g} (warm-up {warmup:.0%}), {seeds:seeds}; LayerNorm's own loss {ln:.4f} against "
        "{unigram:.4f} for the character frequencies alone; against LayerNorm: no mean subtraction {mean:+.4f} "
        "(noise {mean_noise:.4f}), no division {division:+.4f} (noise {division_noise:.4f}).",
    "15.3.division-stabilizes diverged":
        "{steps} steps at lr {lr:g} (warm-up {warmup:.0%}), {seeds:seeds}; LayerNorm's own loss {ln:.4f} against "
        "{unigram:.4f} for the character frequencies alone; against LayerNorm: no mean subtraction {mean:+.4f} "
        "(noise {mean_noise:.4f}); without the division training diverged.",
    "15.3.division-stabilizes mean": "Removing the mean raised the loss beyond the noise.",
    "15.3.division-stabilizes division": "Removing the division did not raise the loss beyond the noise.",
    "15.3.division-stabilizes no training":
        "{steps} steps at lr {lr:g}: LayerNorm itself does not train at this rate in every seed (seed {seed} ends at "
        "{ln:.4f} against {unigram:.4f} for the character frequencies alone, not below them by more than the noise "
        "{noise:.4f}, or diverged), so the rate is not one where LayerNorm trains.",
    "beyond.training":
        "at lr 1e-3: 2024 {calm:loss}, {variant} {calm_variant:loss} ({quality:+.4f}); at lr 1e-2 with warm-up over "
        "10% of the steps: 2024 {hot:loss} ({rise:+.4f}), {variant} {hot_variant:loss} ({variant_rise:+.4f}); noise "
        "threshold {noise:.4f}; the 2024 block's own rise against its noise {base_noise:.4f}.",
    "beyond.training no instability":
        "The 2024 block itself loses no more than the noise at the high rate here, so there is no instability for "
        "the change to remove at this size and depth.",
    "beyond.training not removed": "The change's rise is not below the 2024 block's by more than the noise.",
    # 15.2 on small trained models, and the tracer (exp_long)
    "long size": "Models of width {width}, {layers} layers, trained {steps} steps at L = {L}, one seed;",
    "long no position":
        "rescaling RoPE moves the loss at {band} by at most {moved:.4f} nats against a noise margin of {margin:.4f} (2 "
        "standard errors over windows): the model barely uses position at this size, so no scheme can be told apart.",
    "long no rise":
        "unscaled RoPE does not rise past L beyond the noise ({rise:+.4f}, margin {margin:.4f}), so there is no "
        "degradation to extend or to compare.",
    "15.2.unscaled-rise":
        "unscaled RoPE in {windows} windows of {length} tokens, positions {band} minus 0-{L} of the same window: "
        "{rise:+.4f}, noise margin {margin:.4f} (2 standard errors over windows).",
    "15.2.long-context":
        "loss rise past L: ALiBi {alibi:+.3f}, unscaled RoPE {rope:+.3f} nats/char; ALiBi's rise minus half of "
        "RoPE's in the same window {graceful:+.4f} (margin {margin:.4f}). Learned positions are evaluated only at L: "
        "the table has no entry past position L-1.",
    "15.2.long-context unsettled": "ALiBi's rise is within the noise of half of RoPE's.",
    "15.2.interpolation-finetune":
        "rope_scaling linear with factor {factor} at {length} tokens, inside L (positions 0-{L}): fine-tuning "
        "{steps} steps at that length gains it {linear:+.4f} (its loss before minus after); the same steps gain "
        "unscaled RoPE (the control) {control:+.4f}. Paired over the {windows} windows the interpolated model gains {beyond:+.4f} "
        "more (margin {margin:.4f}).",
    "15.2.extensions-recover":
        "YaRN (factor {factor}) after {steps} steps at {length} tokens: {yarn:.3f} at {band}, against {none:.3f} for "
        "unscaled RoPE there without fine-tuning, whose rise from 0-{L} of the same windows is {rise:+.4f} "
        "({share:.0%} of it removed); the unscaled control after the same steps: {control:.3f}; the control minus "
        "YaRN {below:+.4f} (above the margin {margin:.4f}: YaRN below it; over {windows} windows).",
    "long quick":
        "quick run: a {layers}-layer width-{width} model, {steps} steps at L = {L} (full: {full_layers} layers, "
        "{full_steps} steps at {full_L})",
    "15.6.residual-stream":
        "text {text!r} through the trained pair ({steps} steps each{quick:?, quick recipe|}): the 2024 model's "
        "stream RMS after each block {rms:.2f} (mean over tokens),",
    "15.6.residual-stream final":
        "{final:.2f} after the final RMSNorm, whose per-token RMS varies by {cv_final:.3f} of its mean against "
        "{cv_last:.3f} for the stream entering it ({cleaned:?less|not less}: the module's 'the final RMSNorm cleans "
        "it up', every token brought to one scale).",
    "15.6.residual-stream no final": "no final norm stage, or one token only, recorded.",
    "15.6.residual-stream post-LN":
        "The 2017 model's stream, measured on the stream itself after every post-LN add and norm (gain and shift "
        "included): |mean| <= {mean:.3f}, variance {var_low:.3f}-{var_high:.3f} per token. Exactly mean 0 and "
        "variance 1 holds only before the learned gain and shift; the stream carries them, so 'reset' means brought "
        "back to a fixed scale, which is what keeps it from growing.",
    # 15.2 on SmolLM2 past its context (exp_extend_real)
    "real where":
        "{model} on {documents}, {tokens:,} tokens, factor {factor:g}, no fine-tuning; nats per token, 95% t interval "
        "over the {n} documents.",
    "real one document": "One document gives no interval (the document is the unit), so nothing is judged.",
    "real not run":
        "the quick run does not run SmolLM2-135M past its 8,192-token context (eight passes of 16,384 tokens through "
        "the model); the full `llamablock lab` judges this claim.",
    "15.2.real-past-context": "Unscaled RoPE minus the model in its own sliding window past L: {rise:ci}.",
    "15.2.real-interpolation-blur":
        "Inside L, against the unscaled model: linear {linear:ci}, NTK-aware {ntk:ci}, YaRN {yarn:ci}; linear minus "
        "NTK-aware {vs_ntk:ci}, minus YaRN {vs_yarn:ci}.",
    "15.2.real-dynamic-inside":
        "Dynamic NTK reads the first L tokens in one pass and the rest after a cache, as a generation does; its "
        "factor is 1 up to L by its definition, so inside L it is the unscaled model: largest per-token difference "
        "{gap:.3g} nats.",
    "15.2.real-yarn-factor": "With minus without the factor 0.1 ln s + 1 past L: {past:ci}; inside L {inside:ci}.",
    "15.2.real-training-free":
        "Past L, {named} removes {removed:ci} nats of the unscaled rise {rise:ci}; unscaled + reference - 2 x {named} "
        "(above 0: more than half removed): {over_half:ci}. The other methods, in the table, are not judged. "
        "Fine-tuning is not measured here.",
    "15.2.real-training-free no rise": "Unscaled RoPE does not rise past L beyond the noise: nothing to recover.",
    "15.2.real-training-free partial":
        "{named} removes {share:.0%} of the rise without fine-tuning, not settled above half and not none; whether "
        "modest fine-tuning recovers the rest is not measured.",
}
