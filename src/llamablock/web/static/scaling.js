// rope-scaling (15.2): wavelength of every pair under each method, from llamablock.rope_table.
import { available } from "./common.js";

export async function setup() {
  const section = document.getElementById("figure-rope-scaling");
  if (!(await available(section, "rope-scaling"))) return;
}
