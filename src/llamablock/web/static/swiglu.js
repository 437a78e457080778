// swiglu-gate (15.4): Swish, ReLU and GELU from the library, the gate input marked on each.
import { el, clear, fmt, wire, showValues } from "./common.js";

const W = 560, H = 340, PAD = { l: 44, r: 16, t: 16, b: 34 };
const Y_MIN = -1, Y_MAX = 8;
const STYLE = { swish: { stroke: "#2563eb", width: 3 }, relu: { stroke: "#6b7280", width: 2, dash: "6 4" },
  gelu: { stroke: "#16a34a", width: 2, dash: "2 3" } };

function render(d, form) {
  const svg = document.querySelector("#figure-swiglu-gate svg");
  clear(svg);
  const x0 = d.x[0], x1 = d.x[d.x.length - 1];
  const sx = (x) => PAD.l + ((x - x0) / (x1 - x0)) * (W - PAD.l - PAD.r);
  const sy = (y) => PAD.t + ((Y_MAX - Math.min(Math.max(y, Y_MIN), Y_MAX)) / (Y_MAX - Y_MIN)) * (H - PAD.t - PAD.b);
  // Axes and grid.
  for (let x = Math.ceil(x0); x <= x1; x += 2) {
    el("line", { x1: sx(x), y1: PAD.t, x2: sx(x), y2: H - PAD.b, stroke: x === 0 ? "#9ca3af" : "#f3f4f6" }, svg);
    el("text", { x: sx(x), y: H - PAD.b + 16, class: "tick", "text-anchor": "middle" }, svg, String(x));
  }
  for (let y = Y_MIN; y <= Y_MAX; y += 1) {
    el("line", { x1: PAD.l, y1: sy(y), x2: W - PAD.r, y2: sy(y), stroke: y === 0 ? "#9ca3af" : "#f3f4f6" }, svg);
    el("text", { x: PAD.l - 6, y: sy(y) + 4, class: "tick", "text-anchor": "end" }, svg, String(y));
  }
  el("text", { x: W - PAD.r, y: H - 4, class: "tick", "text-anchor": "end" }, svg, "gate input z");
  // Curves.
  for (const [name, ys] of Object.entries(d.curves)) {
    const s = STYLE[name];
    const points = d.x.map((x, i) => `${sx(x).toFixed(1)},${sy(ys[i]).toFixed(1)}`).join(" ");
    el("polyline", { points, fill: "none", stroke: s.stroke, "stroke-width": s.width,
      "stroke-dasharray": s.dash || "none", class: `curve-${name}` }, svg);
  }
  // The gate input, and each activation's value there.
  el("line", { x1: sx(d.gate), y1: PAD.t, x2: sx(d.gate), y2: H - PAD.b, stroke: "#111827",
    "stroke-dasharray": "3 3", class: "gate-marker" }, svg);
  for (const [name, y] of Object.entries(d.at_gate)) {
    el("circle", { cx: sx(d.gate), cy: sy(y), r: name === "swish" ? 6 : 4, fill: STYLE[name].stroke,
      stroke: "white", "stroke-width": 1.5 }, svg);
  }

  showValues(form);
  const open = Math.abs(d.at_gate.swish) < 0.05 ? "the gate is shut" : "the gate is open";
  document.querySelector("#figure-swiglu-gate .readout").innerHTML = `
    <div><span class="label">Swish(gate) = gate · σ(gate)</span><span class="value">${fmt(d.at_gate.swish, 4)}</span></div>
    <div><span class="label">× up</span><span class="value">${fmt(d.up, 2)}</span></div>
    <div class="total"><span class="label">SwiGLU unit output (${open})</span>
      <span class="value" data-value="product">${fmt(d.product, 4)}</span></div>
    <div class="aside"><span class="label">plain GELU unit, GELU(gate): up has no say</span>
      <span class="value">${fmt(d.plain.gelu, 4)}</span></div>
    <div class="aside"><span class="label">plain ReLU unit, ReLU(gate)</span>
      <span class="value">${fmt(d.plain.relu, 4)}</span></div>`;
}

export function setup() {
  const section = document.getElementById("figure-swiglu-gate");
  const { refresh } = wire(section, {
    endpoint: "/api/swiglu-gate",
    params: (f) => ({ gate: f.gate.value, up: f.up.value }),
    render,
    onInput: (e, f) => showValues(f),
  });
  refresh();
}
