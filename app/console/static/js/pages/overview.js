// Overview: what is stored and what it costs, what is moving, what waits for a person.
import { all, api, query, session } from "../api.js";
import { barChart, colourOf } from "../charts.js";
import { badge, bytes, change, go, h, notice, problemNotice, table, usd, when } from "../ui.js";

export async function overviewPage() {
  const [byTier, byProject, held, running, pending] = await Promise.all([
    api("GET", "/v1/reports/cost?group_by=tier"),
    api("GET", "/v1/reports/cost?group_by=project"),
    all("/v1/actions", { state: "held" }),
    api("GET", `/v1/actions${query({ state: "running", limit: 50 })}`),
    api("GET", `/v1/actions${query({ state: "pending", limit: 50 })}`),
  ]);
  return h(
    "div",
    {},
    h("h1", {}, "Overview"),
    h(
      "section",
      { class: "card" },
      h(
        "div",
        { class: "stats" },
        stat("Stored", bytes(byTier.total_bytes)),
        stat("Per month", usd(byTier.total_usd_month)),
        byTier.deleted_billed_bytes ? stat("Deleted, still billed", `${bytes(byTier.deleted_billed_bytes)} · ${usd(byTier.deleted_billed_usd_month)}/month`) : null,
        stat("Held deletes", String(held.length)),
        stat("Actions in flight", String(running.items.length + pending.items.length)),
      ),
    ),
    h("div", { class: "grid" }, costCard("By tier", byTier), costCard("By project", byProject)),
    heldCard(held),
    flightCard([...running.items, ...pending.items]),
    reconcileCard(),
  );
}

function stat(label, value) {
  return h("div", {}, h("div", { class: "muted small" }, label), h("div", { class: "stat" }, value));
}

// Bytes a provider still bills after a delete (soft delete, old versions) are rows of their
// own kind, beside the group's stored row.
function rowLabel(r) {
  const name = r.name || r.key;
  return r.kind === "deleted_billed" ? `${name} (deleted, still billed)` : name;
}

function costCard(title, report) {
  const colours = colourOf(report.rows.map((r) => r.key));
  const rows = report.rows.map((r) => ({
    label: rowLabel(r),
    value: r.bytes,
    note: `${usd(r.usd_month)}/month`,
    colour: colours.get(r.key),
  }));
  return h(
    "section",
    { class: "card", "aria-label": `Cost ${title.toLowerCase()}` },
    h("h2", {}, `${title}: bytes and $/month`),
    rows.length ? barChart(rows, { label: `Bytes stored ${title.toLowerCase()}`, format: bytes }) : h("p", { class: "muted" }, "Nothing stored yet."),
    table(
      [
        [title.split(" ")[1], rowLabel],
        ["Checkpoints", (r) => r.checkpoints.toLocaleString("en-US"), { num: true }],
        ["Bytes", (r) => bytes(r.bytes), { num: true }],
        ["Trashed", (r) => bytes(r.trashed_bytes), { num: true }],
        ["$/month", (r) => usd(r.usd_month), { num: true }],
      ],
      report.rows,
      { empty: "", label: `Cost ${title.toLowerCase()}` },
    ),
  );
}

function heldCard(held) {
  const out = h("div");
  const sweeps = new Map();
  for (const action of held) {
    const key = action.sweep_id || "(no sweep)";
    if (!sweeps.has(key)) sweeps.set(key, []);
    sweeps.get(key).push(action);
  }
  const blocks = [...sweeps].map(([sweep, actions]) => {
    const total = actions.reduce((sum, a) => sum + a.bytes, 0);
    const rules = [...new Set(actions.map((a) => a.rule))].join(", ");
    const detail = h("details", {}, h("summary", {}, `Show the ${actions.length} actions`), table(
      [
        ["Step", (a) => h("a", { href: `#/runs/${encodeURIComponent(a.run_id)}` }, String(a.step))],
        ["Tier", (a) => a.from_tier || "–"],
        ["Bytes", (a) => bytes(a.bytes), { num: true }],
        ["Reason", (a) => a.reason || "–"],
        ["", (a) => session.admin ? h("button", {
          type: "button", class: "quiet", "aria-label": `Approve the delete of step ${a.step}`,
          onclick: () => approveOne(out, a),
        }, "Approve") : ""],
      ],
      actions,
      { label: `Held deletes of sweep ${sweep}` },
    ));
    return h(
      "div",
      { class: "card", "data-sweep": sweep },
      h("h2", {}, `Sweep ${sweep}`),
      h("p", {}, `${actions.length} deletes held, ${bytes(total)}, asked for by ${rules}.`),
      session.admin && sweep !== "(no sweep)"
        ? h("div", { class: "buttons" }, h("button", {
            type: "button", class: "danger",
            onclick: () => approveSweep(out, sweep, actions.length, total),
          }, `Approve all ${actions.length}`))
        : null,
      detail,
    );
  });
  return h(
    "section",
    { "aria-label": "Held deletes" },
    h("h2", {}, "Held deletes awaiting approval"),
    out,
    blocks.length ? blocks : h("p", { class: "muted card" }, "No delete is waiting for approval."),
  );
}

async function approveSweep(out, sweep, count, total) {
  const answer = await change(out, {
    title: "Approve the sweep's deletes",
    body: `${count} checkpoints (${bytes(total)}) go to the trash and are purged after the trash retention.`,
    danger: true,
    confirmLabel: `Delete ${count}`,
    run: () => api("POST", `/v1/sweeps/${encodeURIComponent(sweep)}/approve`),
    describe: (a) => `Approved: ${Array.isArray(a && a.actions) ? a.actions.length : count} deletes released.`,
  });
  if (answer) setTimeout(() => go(window.location.hash || "#/"), 800);
}

async function approveOne(out, action) {
  const answer = await change(out, {
    title: "Approve one delete",
    body: `Step ${action.step} (${bytes(action.bytes)}) goes to the trash.`,
    danger: true,
    confirmLabel: "Delete",
    run: () => api("POST", `/v1/actions/${encodeURIComponent(action.id)}/approve`),
    describe: (a) => `Approved: the action is now ${a.state}.`,
  });
  if (answer) setTimeout(() => go(window.location.hash || "#/"), 800);
}

function flightCard(actions) {
  return h(
    "section",
    { class: "card", "aria-label": "Actions in flight" },
    h("h2", {}, "Actions in flight"),
    table(
      [
        ["Kind", (a) => a.kind],
        ["Step", (a) => h("a", { href: `#/runs/${encodeURIComponent(a.run_id)}` }, String(a.step))],
        ["From → to", (a) => `${a.from_tier || "–"} → ${a.to_tier || "–"}`],
        ["State", (a) => badge(a.state)],
        ["Progress", (a) => `${bytes(a.bytes_done)} of ${bytes(a.bytes)}`, { num: true }],
        ["Due", (a) => when(a.due_at)],
      ],
      actions,
      { empty: "Nothing is moving right now.", label: "Actions in flight" },
    ),
  );
}

function reconcileCard() {
  const out = h("div");
  const scan = async () => {
    out.replaceChildren(notice("Scanning every tier…"));
    try {
      const found = await api("GET", "/v1/reconcile");
      out.replaceChildren(
        h("p", {}, `${found.scanned_objects.toLocaleString("en-US")} objects scanned: ${found.orphans.length} orphans, ${found.drift.length} drifted.`),
        table([["Tier", (o) => o.tier], ["Orphan", (o) => o.uri]], found.orphans.slice(0, 50), { empty: "No orphans.", label: "Orphans" }),
        table([["Checkpoint", (d) => d.checkpoint_id], ["Problem", (d) => d.problem], ["Where", (d) => d.uri]], found.drift, { empty: "No drift.", label: "Drift" }),
      );
    } catch (error) {
      out.replaceChildren(problemNotice(error));
    }
  };
  return h(
    "section",
    { class: "card", "aria-label": "Reconciliation" },
    h("h2", {}, "Reconciliation"),
    h("p", { class: "muted" }, "Compares every tier with the catalog: objects nobody owns, and catalogued objects missing or changed."),
    session.admin ? h("button", { type: "button", class: "quiet", onclick: scan }, "Scan now") : h("p", { class: "muted" }, "An admin token can scan."),
    out,
  );
}
