// Ledger and audit: filterable, a page at a time, with errors and reasons.
import { api, query } from "../api.js";
import { badge, bytes, filterForm, h, problemNotice, table, when } from "../ui.js";

function filtered(title, path, fields, columns, params, label) {
  const values = Object.fromEntries(fields.map(([name]) => [name, params.get(name) || ""]));
  const controls = fields.map(([name, text, options]) => {
    const id = `f-${name}`;
    const control = options
      ? h("select", { id, name }, options.map((o) => h("option", { value: o, selected: o === values[name] }, o || "any")))
      : h("input", { id, name, value: values[name], type: name === "since" ? "datetime-local" : "text" });
    return [text, control];
  });
  const form = filterForm(path.split("/").pop() === "actions" ? "ledger" : "audit", controls);
  const rows = h("div");
  const more = h("div");
  const items = [];
  const load = async (cursor) => {
    const wanted = { ...values, limit: 100, cursor };
    if (wanted.since) wanted.since = new Date(wanted.since).toISOString();
    try {
      const page = await api("GET", `${path}${query(wanted)}`);
      items.push(...page.items);
      rows.replaceChildren(table(columns, items, { empty: "Nothing matches.", label }));
      more.replaceChildren(page.next_cursor ? h("button", { type: "button", class: "quiet", onclick: () => load(page.next_cursor) }, "Show more") : "");
    } catch (error) {
      rows.replaceChildren(problemNotice(error));
    }
  };
  load(null);
  return h("div", {}, h("h1", {}, title), h("section", { class: "card" }, form, rows, more));
}

export async function ledgerPage(params) {
  return filtered(
    "Ledger",
    "/v1/actions",
    [
      ["state", "State", ["", "held", "pending", "running", "done", "failed", "cancelled"]],
      ["kind", "Kind", ["", "delete", "purge", "move", "copy", "restore"]],
      ["run_id", "Run id"],
      ["checkpoint_id", "Checkpoint id"],
    ],
    [
      ["Created", (a) => when(a.created_at)],
      ["Kind", (a) => a.kind],
      ["Run · step", (a) => h("a", { href: `#/runs/${encodeURIComponent(a.run_id)}` }, `${a.run_id} · ${a.step}`)],
      ["From → to", (a) => `${a.from_tier || "–"} → ${a.to_tier || "–"}`],
      ["Rule", (a) => a.rule],
      ["State", (a) => badge(a.state)],
      ["Bytes", (a) => bytes(a.bytes), { num: true }],
      ["Tries", (a) => `${a.attempts} (${a.retries} retries)`, { num: true }],
      ["Reason · error", (a) => [a.reason || "", a.error ? h("div", { class: "notice error small" }, a.error) : ""]],
    ],
    params,
    "Ledger",
  );
}

export async function auditPage(params) {
  return filtered(
    "Audit",
    "/v1/audit",
    [
      ["actor", "Actor"],
      ["run_id", "Run id"],
      ["checkpoint_id", "Checkpoint id"],
      ["since", "Since"],
    ],
    [
      ["At", (e) => when(e.at)],
      ["Actor", (e) => e.actor],
      ["Event", (e) => `${e.entity} ${e.event}`],
      ["What", (e) => e.entity_id],
      ["Reason", (e) => e.reason || "–"],
      ["Change", (e) => (e.after || e.before ? h("details", {}, h("summary", {}, "before / after"), h("pre", { class: "result" }, JSON.stringify({ before: e.before, after: e.after }, null, 1))) : "–")],
    ],
    params,
    "Audit events",
  );
}
