// rope-visualizer (15.1): a query pair and a key pair, rotated by the library's RoPE.
import { el, clear, fmt, wire, showValues } from "./common.js";

const SIZE = 360, C = SIZE / 2, SCALE = 120; // pixels per unit length
const COLORS = { q: "#2563eb", k: "#ea580c" };

function arrow(svg, v, color, dashed, label) {
  const x = C + SCALE * v[0], y = C - SCALE * v[1]; // SVG y points down
  el("line", { x1: C, y1: C, x2: x, y2: y, stroke: color, "stroke-width": dashed ? 1.5 : 3,
    "stroke-dasharray": dashed ? "5 4" : "none", opacity: dashed ? 0.45 : 1,
    "marker-end": `url(#head-${dashed ? "faint" : color.slice(1)})` }, svg);
  if (label) {
    // Beside the tip, pushed outward, kept inside the picture.
    const lx = Math.min(Math.max(x + 10 * Math.sign(v[0] || 1), 70), SIZE - 70);
    const ly = Math.min(Math.max(y + (v[1] >= 0 ? -8 : 18), 14), SIZE - 6);
    el("text", { x: lx, y: ly, fill: color, class: "arrow-label", "text-anchor": "middle" }, svg, label);
  }
}

function markers(svg) {
  const defs = el("defs", {}, svg);
  for (const [id, color] of [["faint", "#9ca3af"], ...Object.values(COLORS).map((c) => [c.slice(1), c])]) {
    const m = el("marker", { id: `head-${id}`, viewBox: "0 0 10 10", refX: 8, refY: 5,
      markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", fill: color }, m);
  }
}

function render(d, form) {
  const svg = document.querySelector("#figure-rope-visualizer svg");
  clear(svg);
  markers(svg);
  el("circle", { cx: C, cy: C, r: SCALE, fill: "none", stroke: "#e5e7eb" }, svg);
  el("line", { x1: 10, y1: C, x2: SIZE - 10, y2: C, stroke: "#e5e7eb" }, svg);
  el("line", { x1: C, y1: 10, x2: C, y2: SIZE - 10, stroke: "#e5e7eb" }, svg);
  // Arc for the angle between the rotated arrows, drawn at radius 40 from q to k.
  const a0 = Math.atan2(d.q_rot[1], d.q_rot[0]);
  const a1 = a0 + (d.angle_between_deg * Math.PI) / 180;
  const r = 40, sweep = d.angle_between_deg > 0 ? 0 : 1;
  el("path", { d: `M${C + r * Math.cos(a0)},${C - r * Math.sin(a0)} A${r},${r} 0 0 ${sweep} ` +
    `${C + r * Math.cos(a1)},${C - r * Math.sin(a1)}`, fill: "none", stroke: "#6b7280", "stroke-width": 1.5 }, svg);
  arrow(svg, d.q, "#9ca3af", true, null);
  arrow(svg, d.k, "#9ca3af", true, null);
  arrow(svg, d.q_rot, COLORS.q, false, `q at m=${d.m}`);
  arrow(svg, d.k_rot, COLORS.k, false, `k at n=${d.n}`);
  el("text", { x: 12, y: SIZE - 12, class: "note" }, svg, "dashed: before rotation");

  showValues(form);
  form.querySelector("[data-hint=theta]").textContent =
    `θ = ${d.theta.toPrecision(4)} rad per token, wavelength ${fmt(d.wavelength, 1)} tokens`;
  const readout = document.querySelector("#figure-rope-visualizer .readout");
  readout.innerHTML = "";
  const rows = [
    ["query turned by m·θ", `${fmt(d.turn_q_rad, 3)} rad`],
    ["key turned by n·θ", `${fmt(d.turn_k_rad, 3)} rad`],
    ["angle from q to k", `${fmt(d.angle_between_deg, 2)}°`],
    ["dot product ⟨R(m)q, R(n)k⟩", fmt(d.dot, 4), "dot"],
    ["from the gap alone, q · R(n−m) k", fmt(d.dot_from_gap, 4), "gap"],
  ];
  for (const [label, value, key] of rows) {
    const row = document.createElement("div");
    row.innerHTML = `<span class="label"></span><span class="value"></span>`;
    row.children[0].textContent = label;
    row.children[1].textContent = value;
    if (key) row.children[1].dataset.value = key;
    readout.appendChild(row);
  }
}

export function setup() {
  const section = document.getElementById("figure-rope-visualizer");
  const { refresh, form } = wire(section, {
    endpoint: "/api/rope-visualizer",
    params: (f) => ({ m: f.m.value, n: f.n.value, pair: f.pair.value, base: f.base.value, head_dim: 128 }),
    render,
    onInput: (e, f) => showValues(f),
  });
  for (const button of form.querySelectorAll("button[data-shift]")) {
    button.addEventListener("click", () => {
      const k = Number(form.k.value) * Number(button.dataset.shift);
      // Sliders stop at 64; widen them so a shift is never clipped (that would change the gap).
      for (const name of ["m", "n"]) {
        const next = Number(form[name].value) + k;
        if (next < 0) {
          section.querySelector(".error").textContent = `k: shifting by ${k} would put ${name} below 0`;
          return;
        }
        form[name].max = Math.max(Number(form[name].max), next);
      }
      for (const name of ["m", "n"]) form[name].value = Number(form[name].value) + k;
      form.dispatchEvent(new Event("input"));
    });
  }
  refresh();
}
