// Shared by the figures: SVG drawing, API calls, and wiring a form to a figure.
// The page computes nothing the library computes: it asks /api/... and draws the reply.

const SVG_NS = "http://www.w3.org/2000/svg";

// el("line", {x1: 0, ...}, parent, "text"): create an SVG element, append it to parent.
export function el(tag, attrs = {}, parent = null, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

// Numbers for people: fixed decimals, thousands separators for integers.
export function fmt(x, digits = 4) {
  if (digits === null) return Number(x).toLocaleString("en-US");
  return Number(x).toFixed(digits);
}

export class ApiError extends Error {
  constructor(message, parameter, status = null) {
    super(message);
    this.parameter = parameter;
    this.status = status;
  }
}

// GET path?params; a non-2xx reply becomes an ApiError carrying the server's message.
export async function getJSON(path, params = {}) {
  const query = new URLSearchParams(params).toString();
  const reply = await fetch(query ? `${path}?${query}` : path);
  let data = null;
  try {
    data = await reply.json();
  } catch (e) {
    throw new ApiError(`${path}: HTTP ${reply.status}`, null);
  }
  if (!reply.ok) throw new ApiError(data.message || `HTTP ${reply.status}`, data.parameter || null, reply.status);
  return data;
}

// Connect a figure: every input event asks the API again (debounced, newest reply wins) and
// draws. section.dataset.state is "loading", "ready" or "error", which the browser tests watch.
export function wire(section, { endpoint, params, render, onInput = null, events = ["input", "change"] }) {
  const form = section.querySelector("form");
  const errorBox = section.querySelector(".error");
  let seq = 0;
  let timer = null;

  async function refresh() {
    const mine = ++seq;
    try {
      const data = await getJSON(endpoint, params(form));
      if (mine !== seq) return;
      errorBox.textContent = "";
      render(data, form);
      section.dataset.state = "ready";
    } catch (err) {
      if (mine !== seq) return;
      errorBox.textContent = err.parameter ? `${err.parameter}: ${err.message}` : err.message;
      section.dataset.state = "error";
    }
  }

  function schedule(event) {
    section.dataset.state = "loading";
    if (onInput && event) onInput(event, form);
    clearTimeout(timer);
    timer = setTimeout(refresh, 40);
  }

  for (const name of events) form.addEventListener(name, schedule);
  return { refresh: schedule, form };
}

// Show each range's value in the <output data-for=name> next to it.
export function showValues(form, labels = {}) {
  for (const out of form.querySelectorAll("output[data-for]")) {
    const name = out.dataset.for;
    out.textContent = labels[name] ? labels[name](form) : form.elements[name].value;
  }
}

