// gqa (15.5): query heads joined to the KV heads they read; the cache size from the library.
import { el, clear, fmt, getJSON, wire, showValues } from "./common.js";

const W = 640, PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"];
let presets = {};

function setSelect(select, values, chosen) {
  select.innerHTML = "";
  for (const v of values) {
    const option = document.createElement("option");
    option.value = option.textContent = String(v);
    if (v === chosen) option.selected = true;
    select.appendChild(option);
  }
}

function ensureOption(select, value) {
  if (![...select.options].some((o) => o.value === String(value))) {
    const option = document.createElement("option");
    option.value = option.textContent = String(value);
    select.appendChild(option);
  }
  select.value = String(value);
}

function render(d, form) {
  setSelect(form.n_kv_heads, d.kv_divisors, d.n_kv_heads);
  const svg = document.querySelector("#figure-gqa svg");
  clear(svg);
  const qy = 40, ky = 170, margin = 24;
  const xq = (h) => margin + ((h + 0.5) / d.n_heads) * (W - 2 * margin);
  const xk = (j) => margin + ((j + 0.5) / d.n_kv_heads) * (W - 2 * margin);
  const rq = Math.min(9, ((W - 2 * margin) / d.n_heads) * 0.38);
  const rk = Math.min(16, ((W - 2 * margin) / d.n_kv_heads) * 0.4);
  el("text", { x: margin, y: qy - 18, class: "axis-label" }, svg, `${d.n_heads} query heads`);
  el("text", { x: margin, y: ky + 36, class: "axis-label" }, svg,
    `${d.n_kv_heads} key-value head${d.n_kv_heads > 1 ? "s" : ""} (${d.group_size} quer${d.group_size > 1 ? "ies" : "y"} each)`);
  d.kv_head_of_query.forEach((j, h) => {
    const color = PALETTE[j % PALETTE.length];
    el("line", { x1: xq(h), y1: qy + rq, x2: xk(j), y2: ky - rk, stroke: color, opacity: 0.55, "stroke-width": 1.5 }, svg);
  });
  d.kv_head_of_query.forEach((j, h) => {
    el("circle", { cx: xq(h), cy: qy, r: rq, fill: PALETTE[j % PALETTE.length], class: "q-head" }, svg);
  });
  for (let j = 0; j < d.n_kv_heads; j++) {
    el("rect", { x: xk(j) - rk, y: ky - rk, width: 2 * rk, height: 2 * rk, rx: 3,
      fill: PALETTE[j % PALETTE.length], class: "kv-head" }, svg);
  }
  // Cache bar against the MHA cache (one KV head per query head).
  const bx = margin, by = 232, bw = W - 2 * margin, bh = 22;
  el("rect", { x: bx, y: by, width: bw, height: bh, fill: "#f3f4f6", stroke: "#d1d5db" }, svg);
  el("rect", { x: bx, y: by, width: Math.max(2, bw * d.fraction_of_mha), height: bh, fill: "#2563eb", class: "cache-bar" }, svg);
  el("text", { x: bx, y: by + bh + 18, class: "axis-label" }, svg,
    `KV cache ${d.cache_text} of ${d.mha_text} with one KV head per query head (${fmt(100 * d.fraction_of_mha, 1)}%)`);

  showValues(form, { tokens: () => fmt(d.tokens, null) });
  const m = d.measured_decode;
  const bench = m
    ? `measured by llamablock lab (${m.date || "date unknown"}): ` +
      (typeof m.ratio_32_to_8 === "number" ? `32 → 8 KV heads ${fmt(m.ratio_32_to_8, 2)}× faster; ` : "") + m.details
    : "not measured yet: run llamablock lab, then reload";
  const windowed = d.window_text
    ? `<div class="aside"><span class="label">with its sliding window of ${fmt(d.sliding_window, null)} tokens, a rolling cache keeps</span>
       <span class="value">${d.window_text}</span></div>` : "";
  document.querySelector("#figure-gqa .readout").innerHTML = `
    <div class="total"><span class="label">KV cache for ${fmt(d.tokens, null)} tokens (${d.dtype})</span>
      <span class="value big" data-value="cache">${d.cache_text}</span></div>
    <div><span class="label">bytes per token: 2 × ${d.n_layers} layers × ${d.n_kv_heads} KV heads × ${d.head_dim} × ${d.bytes_per_element} B</span>
      <span class="value">${fmt(d.bytes_per_token, null)}</span></div>${windowed}
    <div class="aside"><span class="label">decode time per token</span><span class="value small">${bench}</span></div>`;
}

function params(form) {
  const heads = Number(form.n_heads.value);
  const kv = Number(form.n_kv_heads.value);
  const p = { preset: form.preset.value, n_heads: heads, n_layers: form.n_layers.value,
    head_dim: form.head_dim.value, tokens: 2 ** Number(form.tokens_log2.value), dtype: form.dtype.value };
  // KV heads must divide the query heads; after the query heads change, fall back to MHA.
  p.n_kv_heads = heads % kv === 0 ? kv : heads;
  return p;
}

function applyPreset(form, name) {
  const p = presets[name];
  form.n_heads.value = p.n_heads;
  form.n_layers.value = p.n_layers;
  ensureOption(form.head_dim, p.head_dim);
  ensureOption(form.n_kv_heads, p.n_kv_heads);
}

export async function setup() {
  const section = document.getElementById("figure-gqa");
  const form = section.querySelector("form");
  const data = await getJSON("/api/presets");
  presets = data.presets;
  setSelect(form.preset, Object.keys(presets), data.default);
  applyPreset(form, data.default);
  const { refresh } = wire(section, {
    endpoint: "/api/gqa", params, render,
    onInput: (e, f) => {
      if (e.target === f.preset) applyPreset(f, f.preset.value);
      showValues(f, { tokens: () => fmt(2 ** Number(f.tokens_log2.value), null) });
    },
  });
  refresh();
}
