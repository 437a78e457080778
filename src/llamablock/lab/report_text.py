"""Every line report.md can hold, as a template filled from results.json; report.py writes nothing else.

TEMPLATES: name -> one whole line of the report, its {fields} filled by report.py from the results
document alone (claims, environment, declared ids, timings). A claim's own fields keep their names
({id}, {claim}, {source_value}, {measured}, {unit}, {tolerance}, {details}, {indicative},
{verdict}), so tests/lab/test_report_text.py can match every line of a report to one template and
every such field to the claim it names; {details} and {indicative} are the sentences of
details_text.DETAILS that the claim's entries name, filled with their values. Counts are written
"label n", never "n label(s)", so no sentence needs a plural chosen outside the table.

READINGS: what a key claim's outcome means, one sentence per outcome, used only when that outcome
is the run's: claim id -> (if reproduced, if it differs), each with the claim's own {measured}.
"""

from __future__ import annotations

SECTIONS = {  # section: (title, what it measures)
    "15.1": ("Rotary position embedding",
             "RoPE rotates each query and key pair by position times frequency; the module proves the score then "
             "depends only on the gap m - n. Every rotation below goes through the library's own RoPE, in float32."),
    "15.2": ("Stretching RoPE, and ALiBi",
             "Which RoPE pairs reach angles unseen in training when a 4,096-token model runs at 32,768, what each "
             "context-extension method does to them, ALiBi's slopes, and small models trained short and run long."),
    "15.3": ("RMSNorm",
             "RMSNorm drops LayerNorm's mean and shift. Parameters and outputs are checked exactly; speed is timed "
             "on one thread with both layers written the same way; quality is trained with the norm's placement "
             "fixed."),
    "15.4": ("SwiGLU",
             "The gated feed-forward layer, the 8/3 width rule and what it keeps equal, and quality at equal size."),
    "15.5": ("Grouped-query attention",
             "Cache sizes against the bytes llamablock's KVCache allocates; GQA against MHA with copied key/value "
             "heads on both attention paths; the parameter law; decode speed on one thread; conversion from MHA."),
    "15.6": ("The 2017 and the 2024 block",
             "The module's table in this project's two presets, the residual stream through trained models, and "
             "the two blocks trained at equal parameters."),
    "exercises": ("Exercises", "Each exercise of the module answered by the code, the module's answer beside it."),
    "beyond": ("Beyond the module: what came next",
               "Not claims of the module: the two changes the block's descendants made (q/k norm in Qwen3 and "
               "Gemma 3, sandwich norms in Gemma 2 and 3), each trained as one change to the 2024 block and judged "
               "on the claim its authors made. Counted apart from the module's claims."),
}

TEMPLATES = {
    "title": "# The LLaMA Block, measured",
    "run": "llamablock lab{flag}, {date}; Python {python}, torch {torch}, {machine}; torch threads: {threads} "
           "(timing claims run on one).",
    "counts": "Claims of the module: {n}; reproduced {reproduced}, differs {differs}, not measurable here "
              "{unmeasurable}.",
    "not-run": "Not run (full lab only), counted apart from not measurable: {n} ({ids}).",
    "definitions": "Definitions (true by construction, shown but not counted as reproduced): {n}.",
    "indicative": "Verdicts that are indicative only (the reason is given with each): {n}.",
    "beyond": "Beyond the module, counted apart: {n} more; reproduced {reproduced}, differs {differs}, not "
              "measurable here {unmeasurable}.",
    "legend": "Verdicts: *reproduced* (agrees within the stated tolerance), *differs* (does not; the details say "
              "how), *not measurable here* (the measurement cannot decide: a spread larger than the effect, a model "
              "too small to use what is measured), *not run (full lab only)* (measurable here, skipped by --quick), "
              "*definition* (holds by construction). Timings come from this machine, on one thread, as median "
              "ratios of interleaved calls with a 95% interval of the median; the module's were measured on other "
              "hardware.",
    "quick": "With --quick the claims that need training rest on small models, few steps and one seed, and are "
             "marked indicative. `llamablock lab` without --quick trains larger models for longer, with three "
             "seeds.",
    "section": "## {heading}",
    "table-head": "| id | claim | module | measured | verdict |",
    "table-rule": "|---|---|---|---|---|",
    "row": "| `{id}` | {claim} | {source_value} | {measured} ({unit}) | {verdict} |",
    "row-no-unit": "| `{id}` | {claim} | {source_value} | {measured} | {verdict} |",
    "detail": "- `{id}` ({tolerance}): {details}",
    "detail-no-tolerance": "- `{id}`: {details}",
    "detail-indicative": "- `{id}` ({tolerance}): {details} *Indicative: {indicative}.*",
    "subtable": "  |{cells}|",
    "plot": "  ![{id}]({plot})",
    "meaning": "**What this means.** Claims measured here: {n}; reproduced {reproduced}, differs {differs}, not "
               "measurable here {unmeasurable}, not run (full lab only) {not_run}, definitions {definitions}.",
    "all-judged-reproduced": "Every claim that could be judged here reproduced.",
    "differs": "Differs: `{id}`, module {source_value}, measured {measured}; its details say how.",
    "unmeasurable": "Not measurable here: {ids}; each one's details give the reason, and it says nothing for or "
                    "against its statement.",
    "not-run-here": "Not run (full lab only): {ids}; `llamablock lab` without --quick measures each, against the "
                    "tolerance shown.",
    "defined": "By construction, shown and not counted: {ids}.",
    "indicative-group": "Indicative only, not evidence either way ({indicative}): {ids}.",
    "missing": "Not recorded by this run, so nothing here speaks for or against them: {ids}.",
    "run-head": "## Run",
    "run-table-head": "| experiment | seconds |",
    "run-table-rule": "|---|---|",
    "run-row": "| {title} | {seconds} |",
}
TEMPLATES |= {f"intro {s}": intro for s, (_, intro) in SECTIONS.items()}

READINGS = {
    "15.1.rotation-identity": ("RoPE's score depends only on the gap m - n, as the module proves",
                               "RoPE's score here is not a function of the gap alone ({measured})"),
    "15.1.rope-head-offset": ("a head's float32 scores stay within the rounding float32 allows, also moved 500 tokens "
                              "and near position 20,000",
                              "a head's float32 scores leave the rounding float32 allows"),
    "15.1.learned-table-shift": ("the trained learned table moves a pair's score, when the pair moves, more than 1e5 "
                                 "times RoPE's change ({measured})",
                                 "the trained learned table's shift is not 1e5 times RoPE's change ({measured})"),
    "15.2.ntk-wording": ("NTK-aware scaling leaves the fastest pair alone and slows no other fast pair, as the "
                         "module words it",
                         "measured pair by pair, NTK-aware scaling leaves only the fastest pair alone and slows the "
                         "other fast pairs ({measured})"),
    "15.2.unscaled-rise": ("unscaled RoPE run past its training length loses quality ({measured} nats)",
                           "unscaled RoPE did not lose quality past its training length here ({measured} nats)"),
    "15.2.long-context": ("ALiBi's loss rise past L ({measured} nats) is at most half of unscaled RoPE's",
                          "ALiBi's loss rise past L ({measured} nats) is more than half of unscaled RoPE's"),
    "15.2.interpolation-finetune": ("inside L, fine-tuning helps the interpolated model more than the same steps "
                                    "help unscaled RoPE (gains {measured})",
                                    "inside L, fine-tuning helped the interpolated model no more than the same steps "
                                    "help unscaled RoPE (gains {measured})"),
    "15.2.extensions-recover": ("YaRN with brief fine-tuning removes {measured} of unscaled RoPE's long-context rise "
                                "and beats the fine-tuned control",
                                "YaRN with brief fine-tuning did not recover long-context quality beyond the "
                                "fine-tuned control (share removed {measured})"),
    "15.3.speed-fused": ("compiled, RMSNorm takes {measured} of a three-pass LayerNorm's time (medians), each "
                         "median's 95% interval meeting the module's 0.85-0.90",
                         "compiled, RMSNorm takes {measured} of a three-pass LayerNorm's time (medians), a median's "
                         "95% interval outside the module's 0.85-0.90 at some width"),
    "15.3.division-stabilizes": ("at a learning rate where LayerNorm trains, removing its division hurt and removing "
                                 "its mean did not (no mean, no division: {measured})",
                                 "at a learning rate where LayerNorm trains, it was not the division alone that "
                                 "mattered (no mean, no division: {measured})"),
    "15.3.training-quality": ("the model with RMSNorm trained about as well as with LayerNorm ({measured} nats)",
                              "the model with RMSNorm trained worse than with LayerNorm ({measured} nats)"),
    "15.4.gate-closes": ("the library's SwiGLU unit closes when its gate input is large and negative",
                         "the library's SwiGLU unit does not close as Swish(gate) x up says"),
    "15.4.training-quality": ("SwiGLU reached a lower loss than ReLU and GELU at equal size (SwiGLU minus each: "
                              "{measured} nats)",
                              "SwiGLU's loss was above an ungated layer's at equal size beyond the noise (SwiGLU "
                              "minus ReLU, minus GELU: {measured} nats)"),
    "15.5.gqa-equals-mha": ("GQA computes what MHA with copied key/value heads computes, bit for bit at h_kv = h_q",
                            "GQA does not compute what MHA with copied key/value heads computes ({measured})"),
    "15.5.decode-speed": ("on this CPU 32 -> 8 KV heads decodes {measured}x faster (median), the median's 95% "
                          "interval meeting the module's 3-4x",
                          "on this CPU 32 -> 8 KV heads decodes {measured}x faster (median), outside the module's "
                          "3-4x"),
    "15.5.decode-share": ("reading the cache took a tenth or more of a layer's decode step at 32 KV heads and 8,192 "
                          "tokens, more with more KV heads (shares {measured})",
                          "reading the cache did not both take a tenth of the step and grow with the cache (shares "
                          "{measured})"),
    "15.5.training-quality": ("GQA's loss stayed within the noise of MHA's and below MQA's (GQA - MHA, MQA - GQA: "
                              "{measured})",
                              "GQA's loss was not both close to MHA's and below MQA's (GQA - MHA, MQA - GQA: "
                              "{measured})"),
    "15.5.mha-to-gqa": ("an MHA model averaged into GQA and trained briefly recovers and ends below the control "
                        "(gap to MHA at conversion, after: {measured})",
                        "an MHA model averaged into GQA and trained briefly does not both recover and beat the "
                        "control (gap to MHA at conversion, after: {measured})"),
    "15.6.residual-stream": ("with pre-LN the stream grows block by block and the final RMSNorm brings every token "
                             "to one scale, and post-LN resets it",
                             "the stream does not show pre-LN growth, the final norm's one scale and post-LN reset"),
    "15.6.ablation": ("each judged change of the 2024 block showed the benefit named for it ({measured})",
                      "not every judged change of the 2024 block showed the benefit named for it ({measured})"),
    "15.6.training-stability": ("at ten times the learning rate the 2024 block held up better (rises {measured})",
                                "at ten times the learning rate the 2024 block did not hold up better (rises "
                                "{measured})"),
}
TEMPLATES |= {f"reading {i} {k}": f"In this run, {text}." for i, pair in READINGS.items()
              for k, text in zip(("reproduced", "differs"), pair, strict=True)}
