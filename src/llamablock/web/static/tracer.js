// token-tracer-compare (15.6): one input through the trained 2017 and 2024 models, from llamablock.trace.
import { available } from "./common.js";

export async function setup() {
  const section = document.getElementById("figure-token-tracer-compare");
  if (!(await available(section, "token-tracer-compare"))) return;
}
