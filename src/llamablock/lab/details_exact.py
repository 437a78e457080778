"""The details' templates of the claims checked exactly or symbolically: the library's formulas, counts
and bytes, no training and no timing (details_text.py says how they are filled)."""

EXACT = {
    # 15.1
    "15.1.rotation-identity":
        "the 2 x 2 matrix of llamablock's RoPE at position m is read off by rotating the unit vectors; over m, n in "
        "0..199 the largest entry of R(m)^T R(n) - R(n - m) is {worst:.1e} (float32 angles). The symbolic proof is "
        "ex.rotation-product.",
    "15.1.rope-2d-offset":
        "q, k ~ N(0, 1) in 2D, {draws} draws, positions {first}..{last} in steps of 7, offsets {offsets}; largest "
        "spread per offset: {spread:.2e}. Same order as the module's 4.77e-7 (float32 epsilon is {eps:.3g}): both "
        "are rounding.",
    "15.1.rope-head-offset":
        "q, k ~ N(0, I_32), {draws} draws, offsets {offsets}, starts {first}..{last}, the same {shift} tokens later, "
        "and {far_first}..{far_last} (positions to {far_top:,}). The float32 score departs from a float64 evaluation "
        "of the same rotation by at most {worst_ratio:.2f} of its epsilon-derived bound (at most {far_err:.1e} near "
        "{far_top:,}, where the angles are largest); a pair moved {shift} tokens later changes its float32 score by "
        "at most {worst_move:.2f} of the two bounds together; in float64 the score at a fixed offset varies by "
        "{spread64:.2f} of twice the same bound with float64's epsilon (the identity itself holds to float64 "
        "rounding). The spread at a fixed offset over positions 0..{near_top:,} (the first two start ranges) is "
        "{spread_near:.1e}, the module's 'about 1e-5' being the same float32 rounding.",
    "15.1.learned-table-shift":
        "the lab's trained 2017 model ({rows}-row learned table, width {width}, head width {head_width}), {pairs} "
        "token pairs moved by {shift_first}..{shift_last} positions: median change {change:.3g} (5th-95th "
        "percentile {p5:.3g}-{p95:.3g}) on scores of median size {scale:.3g}, a change of {share:.0%} of the score; "
        "RoPE on the same projected vectors: median {rope:.1e} (floored at one float32 epsilon of the score). The "
        "learned table moves the score {ratio:.3g} times as much as RoPE (module: more than 1e5).",
    "15.1.learned-table-shift quick":
        "quick run: the table of the quick ablation's 2017 model ({steps} steps, width {width})",
    "15.1.learned-table-no-entry":
        "table of {rows}: position {rows} -> {error!r}; RoPE at position {far:,} gives finite cos/sin: {finite}.",
    "15.1.frequency-ratio":
        "theta_0 = {first} rad/token; the last pair (i = d/2 - 1) turns {ratio:,.1f} times slower at d = {d} "
        "(exactly 10000^({d_minus_2}/{d}) = {exact:,.1f}); 'about ten thousand' is the limit as d grows, because the "
        "last exponent is (d - 2)/d, not 1.",
    "15.1.shift-both": "one pair, theta = 1, every (m, n) on a grid in 0..39 and the same pair moved by {by}.",
    # 15.2
    "15.2.unseen-pairs":
        "head width {head}, base 10000. Unchanged: pairs {default:ranges} (closed form {closed:ranges}: wavelength "
        "over {train:,} tokens) are unseen. Interpolation: {linear:ranges} unseen, {linear_crowded} fast pairs "
        "crowded. NTK-aware: see 15.2.ntk-wording. Dynamic NTK at {target:,}: {dynamic:ranges}. YaRN: {yarn:ranges} "
        "unseen, {yarn_crowded:ranges} crowded; its regions: untouched {yarn_fast:ranges}, blend "
        "{yarn_blend:ranges}, fully interpolated {yarn_slow:ranges} ({yarn_ok:?as described|NOT as described}). "
        "LLaMA 3.1's rule at {train:,} -> {target:,}: {llama3:ranges} unseen; on its own setting (base 500,000, "
        "8,192 -> 131,072, factor 8): untouched {l3_fast:ranges}, blend {l3_blend:ranges}, divided by 8 "
        "{l3_slow:ranges} ({l3_ok:?as described|NOT as described}); there pairs {l3_unseen:ranges} still reach "
        "angles unseen in the 8,192-token training, since 8 x 8,192 is half of 131,072 (Meta continued training at "
        "long context; not judged).",
    "15.2.interpolation-crowds":
        "linear interpolation by s = {factor:g}: every pair's angle per token divided by {low:.6f}-{high:.6f} "
        "(first pair {before:.4f} -> {after:.4f} rad/token); so adjacent tokens are 1/{factor:g} as far apart in "
        "the pairs that encode local order.",
    "15.2.ntk-exponent":
        "d = {d}, base 10000 -> {base:,.0f}; slowest pair slowed {slow:.5f}x, fastest {fast:.5f}x.",
    "15.2.ntk-wording":
        "measured pair by pair at {train:,} -> {target:,}, d = {d}: fast pairs {hurt:ranges} (of {fast:ranges}) are "
        "slowed more than 1.1x (up to {worst:.2f}x), and pairs {over:ranges} ({n_over} of the {n_slow} slow pairs) "
        "still reach unseen angles; NTK slows pair i by {factor:g}^(2i/(d-2)), every pair but the first, and fixes "
        "the slowest exactly. The exercise's 'the fastest pair is untouched': pair 0 slowed {first:.6f}x.",
    "15.2.ntk-wording fast":
        "The caption's 'only the slow end' does not hold: {n_hurt} of the {n_fast} fast pairs are slowed more than "
        "1.1x.",
    "15.2.ntk-wording some":
        "The caption's 'some middle pairs' does not hold: {n_over} of the {n_slow} slow pairs still reach unseen "
        "angles, more than half.",
    "15.2.yarn-logit-scale":
        "cos/sin multiplied by {root:.4f} = 0.1 ln {factor:g} + 1, so q.k by {measured:.4f}: logits sharpen by "
        "{sharpen:.0%} when the context is stretched {factor:g} times, which counters the flatter attention over "
        "more keys. The module gives no number; the paper's formula is the source.",
    "15.2.raise-base":
        "theta_0 = base^0 = 1 for every base, and pair i slows by 50^(2i/d), which grows with i: the slowest pair "
        "slows by {slowest:.1f}x (= 50^({d_minus_2}/{d})). A consequence of the formula itself, so shown here, not "
        "counted as a reproduction.",
    "15.2.alibi-slopes": "llamablock.alibi.alibi_slopes (Press et al.'s geometric sequence 2^(-8h/n)).",
    "15.2.alibi-near-far":
        "softmax of the bias alone over {keys:,} keys: head 1 (slope 1/2) looks {first:.1f} tokens back on average, "
        "head {heads} (slope 1/{slowest:g}) {last:.1f}; each halving of the slope about doubles the reach, the "
        "geometric sequence's point. Content scores shift these, the bias sets the scale.",
    # 15.3
    "15.3.param-saving": "counted from the layers' parameters (LayerNorm: gamma and beta; RMSNorm: gamma).",
    "15.3.output-correlation":
        "{rows} vectors of width {d}: N(0, 1): r = {plain:.5f}; N(0, 1) + 0.5 for every row: r = {shared:.5f}; "
        "N(0, 1) + an offset N(0, 1) per row: r = {own:.5f}. For i.i.d. zero-mean entries r ~ sqrt(1 - 1/d) = "
        "{closed:.5f} (each row's own mean is the only difference); the agreement depends on rows being near "
        "zero-mean, which is an input property, not a property of the layers.",
    # 15.4
    "15.4.swish-values": "llamablock.ffn.swish; closed form z / (1 + e^-z): {plus:.6f}, {minus:.6f}.",
    "15.4.gate-closes":
        "GatedFFN.forward on (gate, up) inputs: at gate -20 the largest |output| over up in [-100, 100] is "
        "{closed_max:.2e}, {closed:.1e} of the open gate's {open_max:.1f} at +20 (float32 epsilon {eps32:.1e}); both "
        "settings equal Swish(gate) x up from the closed form to {worst:.1e} relative (8 float64 epsilons allowed: a "
        "handful of roundings in the sigmoid, the products and the projections).",
    "15.4.equal-params":
        "counted from GatedFFN at the library's width rule (gated_ffn_width({d}, multiple_of=1) = {width}) and MLP "
        "at 4d, no biases, d = {d}; LLaMA's rounding up to a multiple of 256 makes its FFN {llama:.4f}x the 4d MLP's "
        "size at d = 4096.",
    "15.4.equal-flops":
        "torch.utils.flop_counter over one forward: 2 x tokens x 8 d^2 on both sides; the element-wise Swish and "
        "product (about 4 x 8/3 d per token) are not matmuls and are left out: {share:.2%} of the matmul FLOPs at "
        "d = {d}, {llama_share:.3%} at d = 4096.",
    "15.4.width-rule":
        "llamablock.ffn.gated_ffn_width(4096): 8/3 x 4096 = 10922.67 rounded up to a multiple of 256 (the "
        "unrounded width is the exercise ex.swiglu-width).",
    # 15.5
    "15.5.cache-bytes":
        "closed form, calculator and allocated buffers agree: {agree}; 32 -> 8 heads is a {reduction:.1%} reduction "
        "(module: 75.0%).",
    "15.5.gqa-equals-mha":
        "h_kv = h_q (8 and 32 heads of 16, one query against 50 cached keys): llamablock's grouped attention against "
        "MHA written head by head differs by {exact:.1e} (module: 0.0). h_kv < h_q: 2-layer RoPE decoders, 8 query "
        "heads with 1, 2 or 4 KV heads, 3 seeds, 2 x 40 tokens, against MHA with each KV head copied to the query "
        "heads of its group: full causal pass (SDPA with enable_gqa) {prefill:.1e}, prompt of 9 then 31 cached "
        "decode steps (grouped matmul) {decode:.1e}, logits up to {scale:.1f}; the MHA model's own full pass and "
        "cached decode disagree by up to {paths:.1e}, so the bound is {bound:.1e}.",
    "15.5.attention-params":
        "counted from llamablock's Attention: removing one KV head removes 2 x d_model x head_dim weights (+ 2 x "
        "head_dim with q/k/v biases) and W_q, W_o are unchanged, for d_model 64 and 96, head width 8 and 16, with "
        "and without biases: {law:?holds|fails}. The module's drop, 16,448 - 9,280 = {drop:,} = 7 x 2 x 64 x 8, fits "
        "the law at d_model 64 with 8 heads of width 8; its totals then need an output bias and no q/k/v bias (the "
        "module does not give its configuration). The attention arithmetic, counted by torch's FlopCounterMode on "
        "LLaMA 3 8B's 32 query heads of 128 against 256 keys:",
    "15.5.attention-params flops": "{kv} {heads} {decode:,} FLOPs per decode step, {masked:,} for 32 masked queries;",
    "15.5.attention-params closed":
        "closed form 2 x 2 x h x d_head x t x s: {decode:,} and {masked:,}; {same:?unchanged, as the module "
        "says|not unchanged}.",
    # 15.6 and the exercises
    "15.6.side-by-side": "presets gpt-2017-small and llama-2024-small:",
    "15.6.side-by-side change": "{field} ({section}): {old} -> {new};",
    "15.6.side-by-side rest":
        "final norm {final_old} -> {final_new}; feed-forward matrices {ffn_old} -> {ffn_new}, d_ff {d_ff_old} = "
        "{times:g} d -> {d_ff_new} (8/3 x {d} = {eight_thirds:.1f} rounded up to a multiple of 256: {rule}); linear "
        "layers with a bias per block {bias_old} of {linear_old} -> {bias_new} of {linear_new}; width {d_old} "
        "and {d}, {layers_old} and {layers_new} blocks; logits at a position {causal:?unchanged by later tokens in "
        "both|changed by a later token in one}. Parameters {params_old:,} and {params_new:,}; KV cache "
        "{kv_old:,} and {kv_new:,} bytes per token at fp16 (the equal-budget comparison is 15.6.ablation).",
    "ex.four-changes":
        "a recall question: the answer is the module's own list, shown beside the config fields of this project's "
        "presets that carry each change; nothing here could be measured differently.",
    "ex.rotation-product":
        "sympy simplifies R(m)^T R(n) - R(n - m) to {zero:?the zero matrix|a matrix that is not zero}; the library's "
        "own rotation is checked numerically in 15.1.rotation-identity.",
    "ex.swiglu-width":
        "the library's width rule without the rounding to 256 (whole units: 8/3 x 4096 = 10922.67 rounds up to "
        "{width}); with it, {rounded}.",
    "ex.rmsnorm-saving": "LayerNorm's parameters minus RMSNorm's, both counted from the library's layers.",
    "ex.kv-cache":
        "8 heads: bytes allocated by KVCache (one layer x 32); 32 heads: {gib32:g} GiB from the calculator "
        "(`llamablock kv-cache`).",
    "beyond.window-cache":
        "Gemma 3 4B's {full} global and {local} local layers (window {window:,}), {tokens:,} tokens, bf16: {whole} "
        "with every layer at the whole context, {ring} with a ring per local layer; the calculator says {calc}.",
    "experiment-error": "the experiment raised {error}",
}
