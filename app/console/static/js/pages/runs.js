// Runs: find one; a run's page shows its checkpoints by step, why each stays or goes
// (the run's dry-run plan), and the changes an admin can make to each.
import { all, api, query, session } from "../api.js";
import { stepChart } from "../charts.js";
import { badge, bytes, carriedNotice, change, filterForm, h, notice, problemNotice, reloadKeeping, table, when } from "../ui.js";

const STATUSES = ["", "active", "completed", "failed"];

export async function runsPage(params) {
  const project = params.get("project") || "";
  const status = params.get("status") || "";
  const [projects, first] = await Promise.all([
    api("GET", "/v1/reports/cost?group_by=project").then((r) => r.rows.map((row) => row.key)),
    api("GET", `/v1/runs${query({ project, status, limit: 100 })}`),
  ]);
  const rows = h("div");
  const more = h("div");
  const show = (page, items) => {
    items.push(...page.items);
    rows.replaceChildren(
      table(
        [
          ["Run", (r) => h("a", { href: `#/runs/${encodeURIComponent(r.id)}` }, r.name)],
          ["Project", (r) => r.project],
          ["Status", (r) => badge(r.status)],
          ["Started", (r) => when(r.started_at)],
          ["Ended", (r) => when(r.ended_at)],
          ["Policy", (r) => r.policy || "by match"],
        ],
        items,
        { empty: "No run matches.", label: "Runs" },
      ),
    );
    more.replaceChildren(
      page.next_cursor
        ? h("button", {
            type: "button", class: "quiet",
            onclick: async () => show(await api("GET", `/v1/runs${query({ project, status, limit: 100, cursor: page.next_cursor })}`), items),
          }, "Show more")
        : "",
    );
  };
  show(first, []);
  const projectInput = h("input", { id: "f-project", name: "project", value: project, list: "projects", placeholder: "every project" });
  const statusSelect = h("select", { id: "f-status", name: "status" }, STATUSES.map((s) => h("option", { value: s, selected: s === status }, s || "any")));
  const form = filterForm(
    "runs",
    [["Project", projectInput], ["Status", statusSelect]],
    h("datalist", { id: "projects" }, projects.map((p) => h("option", { value: p }))),
  );
  return h("div", {}, h("h1", {}, "Runs"), h("section", { class: "card" }, form, rows, more));
}

export async function runPage(params, runId) {
  const [run, checkpoints, tiers] = await Promise.all([
    api("GET", `/v1/runs/${encodeURIComponent(runId)}`),
    all(`/v1/runs/${encodeURIComponent(runId)}/checkpoints`),
    all("/v1/tiers"),
  ]);
  let plan = null;
  let planProblem = null;
  try {
    plan = await api("POST", "/v1/plan", { run_id: runId });
  } catch (error) {
    planProblem = error;
  }
  const fate = fates(plan);
  const out = h("div", { "aria-live": "polite" }, carriedNotice());
  const refresh = () => reloadKeeping(out);
  const byStep = [...checkpoints].sort((a, b) => a.step - b.step);
  return h(
    "div",
    {},
    h("p", {}, h("a", { href: `#/runs${query({ project: run.project })}` }, `← ${run.project}`)),
    h("h1", {}, run.name),
    h(
      "section",
      { class: "card" },
      h("p", {}, badge(run.status), ` project ${run.project} · started ${when(run.started_at)}`, run.ended_at ? ` · ended ${when(run.ended_at)}` : "", ` · policy ${run.policy || "chosen by match"}`),
      checkpoints.length ? stepChart(byStep, { label: `Checkpoints of ${run.name} by step`, format: bytes }) : h("p", { class: "muted" }, "No checkpoint yet."),
    ),
    h(
      "section",
      { class: "card", "aria-label": "Checkpoints" },
      h("h2", {}, "Checkpoints"),
      planProblem ? problemNotice(planProblem) : null,
      out,
      table(
        [
          ["Step", (c) => String(c.step)],
          ["Class", (c) => c.class],
          ["State", (c) => badge(c.state)],
          ["Tier", (c) => c.tier || "–"],
          ["Size", (c) => bytes(c.size_bytes), { num: true }],
          ["Metrics", (c) => Object.entries(c.metrics || {}).map(([k, v]) => `${k} ${Number(v).toPrecision(4)}`).join(", ") || "–"],
          ["Pin", (c) => (c.pinned ? `pinned: ${c.pin_reason || ""}` : "–")],
          ["Policy says", (c) => fate.get(c.id) || (c.state === "active" ? "no action now" : "–")],
          ["", (c) => (session.admin ? controls(c, tiers, out, refresh) : "")],
        ],
        [...checkpoints],
        { empty: "No checkpoint.", label: "Checkpoints" },
      ),
    ),
  );
}

// checkpoint id -> what the run's plan does with it, and why
function fates(plan) {
  const out = new Map();
  if (!plan) return out;
  for (const a of plan.actions) {
    const where = a.to_tier ? ` to ${a.to_tier}` : "";
    out.set(a.checkpoint_id, `${a.kind}${where} (${a.rule}${a.state === "held" ? ", held" : ""}): ${a.reason}`);
  }
  for (const k of plan.kept) if (!out.has(k.checkpoint_id)) out.set(k.checkpoint_id, `kept: ${k.reasons.join("; ")}`);
  for (const s of plan.skipped) if (!out.has(s.checkpoint_id)) out.set(s.checkpoint_id, `skipped (${s.rule}): ${s.reason}`);
  return out;
}

function controls(c, tiers, out, refresh) {
  const id = encodeURIComponent(c.id);
  const buttons = [];
  const label = (verb) => `${verb} step ${c.step}`;
  if (c.state === "active" && !c.pinned) {
    buttons.push(h("button", { type: "button", class: "quiet", "aria-label": label("Pin"), onclick: async () => {
      const reason = h("input", { id: "pin-reason", name: "reason", value: "kept by hand", required: true });
      const done = await change(out, {
        title: `Pin step ${c.step}`,
        body: "A pinned checkpoint is never moved off its tier or deleted by a policy.",
        extra: h("label", { for: "pin-reason" }, "Reason", reason),
        confirmLabel: "Pin",
        run: () => api("POST", `/v1/checkpoints/${id}/pin`, { reason: reason.value }),
        describe: (a) => `Step ${a.step} is pinned (${a.pin_reason}).`,
      });
      if (done) refresh();
    } }, "Pin"));
  }
  if (c.pinned) {
    buttons.push(h("button", { type: "button", class: "quiet", "aria-label": label("Unpin"), onclick: async () => {
      const done = await change(out, {
        title: `Unpin step ${c.step}`,
        body: "Its policy may move or delete it again.",
        confirmLabel: "Unpin",
        run: () => api("DELETE", `/v1/checkpoints/${id}/pin`),
        describe: (a) => `Step ${a.step} is no longer pinned.`,
      });
      if (done) refresh();
    } }, "Unpin"));
  }
  if (c.state === "active") {
    buttons.push(h("button", { type: "button", class: "quiet", "aria-label": label("Restore"), onclick: async () => {
      const select = h("select", { id: "restore-tier", name: "tier" }, tiers.map((t) => h("option", { value: t.name }, t.name)));
      const action = await change(out, {
        title: `Restore step ${c.step}`,
        body: `Stages a copy of ${bytes(c.size_bytes)} onto the tier you choose; the other copies stay.`,
        extra: h("label", { for: "restore-tier" }, "Onto tier", select),
        confirmLabel: "Restore",
        run: () => api("POST", `/v1/checkpoints/${id}/restore`, { tier: select.value }),
        describe: (a) => `Restore queued: action ${a.id}, ${a.state}.`,
      });
      if (action && action.id) watch(out, action);
    } }, "Restore"));
    buttons.push(h("button", { type: "button", class: "quiet", "aria-label": label("Delete"), disabled: c.pinned, onclick: async () => {
      const action = await change(out, {
        title: `Delete step ${c.step}`,
        body: `${bytes(c.size_bytes)} go to the trash; they can be undeleted until the purge.`,
        danger: true,
        confirmLabel: "Delete",
        run: () => api("DELETE", `/v1/checkpoints/${id}`),
        describe: (a) => `Delete queued: action ${a.id}, ${a.state}.`,
      });
      if (action && action.id) watch(out, action);
    } }, "Delete"));
  }
  if (c.state === "trashed") {
    buttons.push(h("button", { type: "button", class: "quiet", "aria-label": label("Undelete"), onclick: async () => {
      const done = await change(out, {
        title: `Undelete step ${c.step}`,
        body: "Back from the trash to active, and protected from policy deletes and moves for the trash retention.",
        confirmLabel: "Undelete",
        run: () => api("POST", `/v1/checkpoints/${id}/undelete`),
        describe: (a) => `Step ${a.step} is ${a.state} again${a.protected_until ? `, protected until ${when(a.protected_until)}` : ""}.`,
      });
      if (done) refresh();
    } }, "Undelete"));
  }
  return h("div", { class: "buttons" }, buttons);
}

// Follow an action the console started until it ends, in the same panel.
async function watch(out, action) {
  const line = h("p", { class: "small", "data-action": action.id }, `Action ${action.id}: ${action.state}`);
  out.append(line);
  let current = action;
  for (let i = 0; i < 600 && !["done", "failed", "cancelled"].includes(current.state); i += 1) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    try {
      current = await api("GET", `/v1/actions/${encodeURIComponent(action.id)}`);
    } catch (error) {
      out.append(problemNotice(error));
      return;
    }
    line.textContent = `Action ${action.id}: ${current.state}${current.phase ? ` (${current.phase})` : ""}, ${bytes(current.bytes_done)} of ${bytes(current.bytes)}`;
  }
  line.replaceWith(
    notice(`Action ${action.id} (${current.kind}) ended ${current.state}${current.error ? `: ${current.error}` : ""}.`, current.state === "done" ? "ok" : "error"),
  );
}
