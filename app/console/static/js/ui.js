// Small DOM helpers: elements, numbers people read, tables, the confirmation dialog and
// the panel that shows what the service answered.
import { Problem, query } from "./api.js";

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = value;
    else if (value === true) node.setAttribute(name, "");
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 || Math.abs(value) >= 100 ? 0 : 1)} ${units[unit]}`;
}

export function usd(n) {
  if (n === null || n === undefined) return "–";
  const value = Number(n);
  const digits = Math.abs(value) < 10 && value !== 0 ? 2 : 0;
  return `${value < 0 ? "−" : ""}$${Math.abs(value).toLocaleString("en-US", {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  })}`;
}

export function when(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return date.toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

export function badge(text) {
  return h("span", { class: `badge ${text}` }, text);
}

// A table: columns are [heading, (row) => cell, {num}]; on a phone it stacks.
export function table(columns, rows, { empty = "Nothing here.", label } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { class: "stack", "aria-label": label },
      h("thead", {}, h("tr", {}, columns.map(([title, , o]) => h("th", { class: o && o.num ? "num" : null, scope: "col" }, title)))),
      h(
        "tbody",
        {},
        rows.map((row) =>
          h(
            "tr",
            {},
            columns.map(([title, cell, o]) => h("td", { class: o && o.num ? "num" : null, "data-label": title }, cell(row))),
          ),
        ),
      ),
    ),
  );
}

export function notice(text, kind = "") {
  return h("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

// What a refused request says: the problem's detail and, per field, its errors.
export function problemNotice(error) {
  if (!(error instanceof Problem)) return notice(String(error && error.message ? error.message : error), "error");
  const items = error.errors.map((e) => h("li", {}, e.field ? `${e.field}: ${e.detail || e.message || ""}` : e.detail || e.message || JSON.stringify(e)));
  return h(
    "div",
    { class: "notice error", role: "alert" },
    h("strong", {}, `Refused (${error.status}): `),
    error.detail,
    error.field ? h("div", { class: "small" }, `Field: ${error.field}`) : null,
    items.length ? h("ul", { class: "problems" }, items) : null,
  );
}

// Ask before changing data: says what will happen; resolves true on "Confirm".
export function confirmAction(title, body, { danger = false, confirmLabel = "Confirm", extra = null } = {}) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  const holder = document.getElementById("confirm-body");
  holder.replaceChildren(h("p", {}, body), extra || "");
  const ok = document.getElementById("confirm-ok");
  ok.textContent = confirmLabel;
  ok.className = danger ? "danger" : "";
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

// Run a change after confirmation and show the service's answer in `out`.
export async function change(out, { title, body, danger, run, describe, extra, confirmLabel }) {
  if (!(await confirmAction(title, body, { danger, extra, confirmLabel }))) return null;
  out.replaceChildren(notice("Sending…"));
  try {
    const answer = await run();
    out.replaceChildren(notice(describe ? describe(answer) : "Done.", "ok"));
    return answer ?? true;
  } catch (error) {
    out.replaceChildren(problemNotice(error));
    return null;
  }
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// What a change said, kept for the next render of the page: the page reloads after a
// change to show its effect, and the admin must still read what the service answered.
let carried = { hash: null, nodes: [] };

// Load the page shown afresh, keeping what `out` says on the new render (see `carriedNotice`).
export function reloadKeeping(out) {
  carried = { hash: window.location.hash, nodes: [...out.childNodes] };
  go(window.location.hash);
}

// The notice a reload kept for this page, once: a later visit starts clean.
export function carriedNotice() {
  const { hash, nodes } = carried;
  carried = { hash: null, nodes: [] };
  return hash === window.location.hash ? nodes : [];
}

// Show `hash`; asking again for the page already shown loads it afresh.
export function go(hash) {
  if (window.location.hash === hash) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else window.location.hash = hash;
}

// A row of labelled filters for `page` (e.g. "ledger"): submitting shows the page with
// the filters in its address, so a filtered view can be bookmarked and shared.
export function filterForm(page, controls, ...extra) {
  return h(
    "form",
    {
      class: "filters",
      role: "search",
      onsubmit: (event) => {
        event.preventDefault();
        const chosen = Object.fromEntries(controls.map(([, control]) => [control.name, control.value.trim()]));
        go(`#/${page}${query(chosen)}`);
      },
    },
    controls.map(([text, control]) => h("label", { for: control.id }, text, control)),
    extra,
    h("button", { type: "submit" }, "Filter"),
  );
}
