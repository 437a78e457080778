// rope-scaling (15.2): the wavelength of every pair under each method, one panel per method,
// from llamablock.diagnostics.rope_table (the code behind `llamablock rope`). Red: the pair reaches angles
// at the target length that it never reached within the training length. Amber: a pair that had
// already turned fully in training is slowed down (crowded: neighbours sit closer than trained).
import { el, clear, fmt, wire, showValues } from "./common.js";

const W = 960, H = 440, PAD = { l: 58, r: 8, t: 44, b: 52 }, GAP = 12;
const SEEN = "#2563eb", UNSEEN = "#dc2626", CROWDED = "#d97706";
const colour = (m, i) => (m.unseen[i] ? UNSEEN : m.crowded[i] ? CROWDED : SEEN);

function render(d, form) {
  const svg = document.querySelector("#figure-rope-scaling svg");
  clear(svg);
  const all = d.methods.flatMap((m) => m.wavelength);
  const lo = Math.floor(Math.log10(Math.min(...all, d.train_len))), hi = Math.ceil(Math.log10(Math.max(...all, d.target_len)));
  const panelW = (W - PAD.l - PAD.r - GAP * (d.methods.length - 1)) / d.methods.length;
  const sy = (w) => PAD.t + ((hi - Math.log10(w)) / (hi - lo)) * (H - PAD.t - PAD.b);
  const pairs = d.methods[0].wavelength.length;
  // Shared y axis: powers of ten.
  for (let e = lo; e <= hi; e++) {
    el("line", { x1: PAD.l, y1: sy(10 ** e), x2: W - PAD.r, y2: sy(10 ** e), stroke: "#f3f4f6" }, svg);
    el("text", { x: PAD.l - 6, y: sy(10 ** e) + 4, class: "tick", "text-anchor": "end" }, svg, e <= 3 ? fmt(10 ** e, null) : `1e${e}`);
  }
  el("text", { x: 14, y: PAD.t + (H - PAD.t - PAD.b) / 2, class: "axis-label", "text-anchor": "middle",
    transform: `rotate(-90 14 ${PAD.t + (H - PAD.t - PAD.b) / 2})` }, svg, "wavelength (tokens)");
  const base = d.methods[0];
  const legend = [["sees only trained angles", SEEN], ["crowded: a fast pair slowed", CROWDED], ["reaches unseen angles", UNSEEN]];
  legend.forEach(([text, c], i) => {
    el("circle", { cx: PAD.l + 6 + i * 200, cy: H - 8, r: 4, fill: c }, svg);
    el("text", { x: PAD.l + 14 + i * 200, y: H - 4, class: "tick" }, svg, text);
  });
  el("line", { x1: PAD.l + 610, y1: H - 8, x2: PAD.l + 634, y2: H - 8, stroke: "#d1d5db", "stroke-width": 2 }, svg);
  el("text", { x: PAD.l + 640, y: H - 4, class: "tick" }, svg, "unscaled wavelengths");
  d.methods.forEach((m, j) => {
    const x0 = PAD.l + j * (panelW + GAP);
    const sx = (i) => x0 + 6 + (i / Math.max(pairs - 1, 1)) * (panelW - 12);
    const g = el("g", { class: "panel", "data-method": m.name }, svg);
    el("rect", { x: x0, y: PAD.t, width: panelW, height: H - PAD.t - PAD.b, fill: "none", stroke: "#e5e7eb" }, g);
    el("text", { x: x0 + panelW / 2, y: PAD.t - 24, class: "panel-title", "text-anchor": "middle" }, g, m.label);
    el("text", { x: x0 + panelW / 2, y: PAD.t - 8, class: "tick", "text-anchor": "middle",
      fill: m.n_unseen ? UNSEEN : "#16a34a" }, g, m.n_unseen ? `${m.n_unseen} of ${pairs} pairs unseen` : "no pair unseen");
    for (const [len, dash, name] of [[d.train_len, "5 4", "train"], [d.target_len, "1 3", "target"]]) {
      el("line", { x1: x0, y1: sy(len), x2: x0 + panelW, y2: sy(len), stroke: "#374151", "stroke-dasharray": dash }, g);
      if (j === 0) el("text", { x: x0 + 4, y: sy(len) - 4, class: "tick" }, g, `${name} ${fmt(len, null)}`);
    }
    if (j > 0) {  // the unscaled wavelengths, faint, for comparison
      el("polyline", { points: base.wavelength.map((w, i) => `${sx(i).toFixed(1)},${sy(w).toFixed(1)}`).join(" "),
        fill: "none", stroke: "#d1d5db", "stroke-width": 1.5 }, g);
    }
    m.wavelength.forEach((w, i) => {
      el("circle", { cx: sx(i), cy: sy(w), r: m.unseen[i] ? 3 : 2.2, fill: colour(m, i),
        class: m.unseen[i] ? "unseen" : m.crowded[i] ? "crowded" : "seen" }, g);
    });
    el("text", { x: x0 + panelW / 2, y: H - PAD.b + 14, class: "tick", "text-anchor": "middle" }, g,
      `pair 0 … ${pairs - 1}, fast → slow`);
  });
  showValues(form, { target_len: () => fmt(d.target_len, null) });
  const readout = document.querySelector("#figure-rope-scaling .readout");
  readout.innerHTML = "";
  for (const m of d.methods) {
    const row = document.createElement("div");
    row.innerHTML = `<span class="label"></span><span class="value"></span>`;
    row.children[0].textContent = `${m.label}: ${m.n_crowded} crowded` +
      (m.attention_factor !== 1 ? `, attention logits × ${fmt(m.attention_factor, 3)}` : "");
    row.children[1].textContent = `${m.n_unseen} of ${m.wavelength.length} pairs unseen`;
    readout.appendChild(row);
  }
}

export function setup() {
  const section = document.getElementById("figure-rope-scaling");
  const { refresh } = wire(section, {
    endpoint: "/api/rope-scaling",
    params: (f) => ({ train_len: f.train_len.value, target_len: 2 ** Number(f.target_log2.value),
      head_dim: f.head_dim.value, base: f.base.value }),
    render,
    onInput: (e, f) => showValues(f, { target_len: () => fmt(2 ** Number(f.target_log2.value), null) }),
  });
  refresh();
}
