// Start every figure; one that fails to start shows its error and leaves the others running.
import * as rope from "./rope.js";
import * as scaling from "./scaling.js";
import * as swiglu from "./swiglu.js";
import * as gqa from "./gqa.js";
import * as tracer from "./tracer.js";

const FIGURES = { "figure-rope-visualizer": rope, "figure-rope-scaling": scaling,
  "figure-swiglu-gate": swiglu, "figure-gqa": gqa, "figure-token-tracer-compare": tracer };

for (const [id, figure] of Object.entries(FIGURES)) {
  Promise.resolve()
    .then(() => figure.setup())
    .catch((err) => {
      const section = document.getElementById(id);
      section.querySelector(".error").textContent = `could not start: ${err.message}`;
      section.dataset.state = "error";
    });
}
