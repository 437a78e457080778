// token-tracer-compare (15.6): the same text through the trained 2017 and 2024 models, stage by
// stage, from llamablock.studies.trace. Bars: RMS of the residual stream at one character, per stage,
// on one scale for both models; the chosen block and stage are highlighted and detailed below.
import { el, clear, fmt, getJSON } from "./common.js";

const W = 960, H = 320, PAD = { l: 44, t: 34, b: 46 }, GAP = 40;
const COLOR = { 2017: "#ea580c", 2024: "#2563eb" };
const DESCRIPTION = { 2017: "post-LN LayerNorm, learned positions, ReLU, MHA", 2024: "pre-LN RMSNorm, RoPE, SwiGLU, GQA" };
// Shown while a trace runs: the server trains the pair on its first trace and caches it.
const TRACING = "tracing… (the first trace trains both models, which takes a while, and caches them)";
let last = null;

function short(name) {
  const m = name.match(/^block (\d+) after (attention|feed-forward)$/);
  if (m) return `${m[1]}·${m[2] === "attention" ? "att" : "ffn"}`;
  return { embeddings: "emb", "+ positions": "+pos", "final norm": "norm" }[name] || name;
}

const quote = (t) => JSON.stringify(t);

// A round tick step (1, 2, 2.5 or 5 times a power of ten) at least x.
function niceStep(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= x);
}

function draw(section, form) {
  const d = last, tok = Number(form.token.value);
  const chosen = `block ${form.block.value} after ${form.stage.value}`;
  const svg = section.querySelector("svg");
  clear(svg);
  const stagesOf = (m) => m.stages.filter((s) => s.name !== "logits");
  const highest = Math.max(...d.models.flatMap((m) => stagesOf(m).map((s) => s.rms[tok])));
  const step = niceStep(highest / 4), top = Math.ceil(highest / step) * step;
  const panelW = (W - PAD.l - GAP - 10) / d.models.length;
  const sy = (v) => H - PAD.b - (v / top) * (H - PAD.t - PAD.b);
  for (let k = 0; k * step <= top + 1e-9; k++) {
    const v = k * step;
    el("line", { x1: PAD.l, y1: sy(v), x2: W - 10, y2: sy(v), stroke: "#f3f4f6" }, svg);
    el("text", { x: PAD.l - 6, y: sy(v) + 4, class: "tick", "text-anchor": "end" }, svg, String(Number(v.toFixed(6))));
  }
  d.models.forEach((m, j) => {
    const x0 = PAD.l + j * (panelW + GAP), stages = stagesOf(m), bw = panelW / stages.length;
    el("text", { x: x0 + panelW / 2, y: 16, class: "panel-title", "text-anchor": "middle" }, svg,
      `${m.arch} block (${m.preset}): RMS of the stream at ${quote(d.tokens[tok])}`);
    stages.forEach((s, i) => {
      const on = s.name === chosen, x = x0 + i * bw + bw * 0.15, v = s.rms[tok];
      el("rect", { x, y: sy(v), width: bw * 0.7, height: Math.max(1, H - PAD.b - sy(v)), fill: COLOR[m.arch],
        opacity: on ? 1 : 0.35, class: on ? "stage chosen" : "stage", "data-stage": s.name }, svg);
      el("text", { x: x + bw * 0.35, y: sy(v) - 4, class: "tick", "text-anchor": "middle" }, svg, fmt(v, v < 10 ? 2 : 1));
      el("text", { x: x + bw * 0.35, y: H - PAD.b + 14, class: "tick", "text-anchor": "middle",
        "font-weight": on ? 700 : 400 }, svg, short(s.name));
    });
  });
  el("text", { x: PAD.l, y: H - 8, class: "note" }, svg,
    "emb: embeddings · +pos: after adding positions (2017 only) · n·att / n·ffn: block n after attention / feed-forward · norm: final RMSNorm (2024 only)");

  const readout = section.querySelector(".readout");
  readout.innerHTML = "";
  for (const m of d.models) {
    const s = m.stages.find((x) => x.name === chosen);
    const col = document.createElement("div");
    col.className = "model";
    col.dataset.arch = m.arch;
    const line = (label, value, key) => {
      const row = document.createElement("div");
      row.innerHTML = `<span class="label"></span><span class="value"></span>`;
      row.children[0].textContent = label;
      row.children[1].textContent = value;
      if (key) row.children[1].dataset.value = key;
      col.appendChild(row);
    };
    const head = document.createElement("h3");
    head.textContent = `${m.arch}: ${DESCRIPTION[m.arch] || m.preset}`;
    head.style.color = COLOR[m.arch];
    col.appendChild(head);
    line(`RMS, ${chosen}`, fmt(s.rms[tok], 3), "rms");
    line("mean · variance", `${fmt(s.mean[tok], 3)} · ${fmt(s.var[tok], 3)}`);
    if (s.normalized) {
      line("before LayerNorm's scale: mean · variance",
        `${fmt(s.normalized.mean[tok], 3)} · ${fmt(s.normalized.var[tok], 3)}`);
    }
    line(`next after ${quote(d.tokens[d.tokens.length - 1])}`, m.top.map((p) => `${quote(p.token)} ${fmt(p.prob, 2)}`).join("  "));
    line("parameters · training", `${fmt(m.params, null)} · ${m.steps} steps, val loss ${m.val_loss === null ? "?" : fmt(m.val_loss, 3)}`);
    readout.appendChild(col);
  }
}

function fill(select, values, chosen) {
  const keep = select.value;
  select.innerHTML = "";
  values.forEach(([value, label]) => {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = label;
    select.appendChild(o);
  });
  select.value = values.some(([v]) => String(v) === keep) ? keep : String(chosen);
}

async function run(section, form, note, train = true) {
  section.dataset.state = "loading";
  section.querySelector(".error").textContent = "";
  const hint = section.querySelector(".hint-run");
  hint.textContent = note;
  try {
    last = await getJSON("/api/token-tracer", { text: form.text.value, train });
    fill(form.block, Array.from({ length: last.blocks }, (_, i) => [i + 1, `block ${i + 1}`]), 1);
    const n = last.tokens.length;
    form.token.innerHTML = "";
    fill(form.token, last.tokens.map((t, i) => [i, `${i + 1}: ${quote(t)}`]), n - 1);
    form.token.value = String(n - 1);
    hint.textContent = "";
    draw(section, form);
    section.dataset.state = "ready";
  } catch (err) {
    hint.textContent = "";
    if (err.status === 503) {  // the server is training the pair in the background: ask again shortly
      hint.textContent = err.message;
      setTimeout(() => run(section, form, err.message, train), 5000);
      return;
    }
    if (err.status === 409) {  // on load, with the pair not trained yet: wait for a press of Trace
      hint.textContent = `Press Trace to start: ${err.message}.`;
      section.dataset.state = "idle";
      return;
    }
    section.querySelector(".error").textContent = err.parameter ? `${err.parameter}: ${err.message}` : err.message;
    section.dataset.state = "error";
  }
}

export function setup() {
  const section = document.getElementById("figure-token-tracer-compare");
  const form = section.querySelector("form");
  const hint = document.createElement("p");
  hint.className = "hint-run";
  section.querySelector(".plot").before(hint);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    run(section, form, last ? "tracing…" : TRACING);
  });
  for (const name of ["block", "stage", "token"]) {
    form[name].addEventListener("change", () => { if (last) draw(section, form); });
  }
  return run(section, form, "tracing…", false);  // at once only if the pair is already trained
}
