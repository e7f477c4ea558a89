// The policy editor's backtest: the draft replayed over the catalog's own history
// (POST /v1/backtest with the policy inline, so it works before saving), beside what was
// actually stored, and its regrets. Run on demand only: a backtest reads the whole history.
import { api } from "../api.js";
import { lineChart } from "../charts.js";
import { bytes, h, notice, problemNotice, table, usd, when } from "../ui.js";

const DRAFT = "#1f5fbf";
const ACTUAL = "#c0392b";

// `draft()` is the editor's policy as an object (it throws while the YAML does not parse);
// `projects` the names offered as a scope. Returns the panel and `changed()`, for the
// editor to call on every edit (cheap: it only parses).
export function backtestPanel({ draft, projects }) {
  const scope = h("select", { id: "backtest-project", name: "project" }, h("option", { value: "" }, "every project"), projects.map((p) => h("option", { value: p }, p)));
  const since = h("input", { id: "backtest-since", name: "since", type: "date", "aria-describedby": "backtest-about" });
  const button = h("button", { type: "submit", "aria-describedby": "backtest-hint" }, "Run backtest");
  const hint = h("span", { id: "backtest-hint", class: "muted small" });
  const out = h("div", { id: "backtest-result", "aria-live": "polite" });
  let running = false;
  let shown = false; // a result of the draft as it is now is on screen
  let edits = 0; // to tell whether the draft changed while a backtest ran

  const policy = () => {
    const document = draft();
    if (!document.name) document.name = "draft"; // a new policy not named yet
    return document;
  };
  const parses = () => {
    try {
      policy();
      return true;
    } catch {
      return false;
    }
  };
  const ready = () => {
    const ok = parses();
    button.disabled = running || !ok;
    hint.textContent = ok ? "" : "The draft does not parse: fix the YAML to run a backtest.";
    return ok;
  };

  const run = async () => {
    if (running || !ready()) return;
    const body = { policy: policy() };
    if (scope.value) body.project = scope.value;
    if (since.value) body.since = `${since.value}T00:00:00Z`;
    const asked = edits;
    running = true;
    button.disabled = true;
    out.setAttribute("aria-busy", "true");
    out.replaceChildren(notice("Replaying the catalog's history under the draft…"));
    try {
      out.replaceChildren(result(await api("POST", "/v1/backtest", body)));
      shown = edits === asked;
      if (!shown) out.prepend(stale());
    } catch (error) {
      out.replaceChildren(problemNotice(error));
      shown = false;
    } finally {
      running = false;
      out.removeAttribute("aria-busy");
      ready();
    }
  };

  const changed = () => {
    edits += 1;
    ready();
    if (shown) {
      shown = false;
      out.prepend(stale());
    }
  };

  const form = h(
    "form",
    { class: "filters", "aria-label": "Backtest", onsubmit: (event) => { event.preventDefault(); run(); } },
    h("label", { for: "backtest-project" }, "Backtest on", scope),
    h("label", { for: "backtest-since" }, "Since (UTC day)", since),
    button,
    hint,
  );
  ready();
  const element = h(
    "section",
    { class: "card", "aria-label": "Backtest" },
    h("h2", {}, "Backtest: what it would have done"),
    h("p", { class: "muted" }, "The draft replayed over the runs the catalog had, from their history, beside what was actually stored; its regrets are checkpoints it would have deleted or moved that people came back for."),
    form,
    h("p", { id: "backtest-about", class: "muted small" }, "Since left blank: from the first event in scope. A backtest reads every run in scope, so it runs only when asked."),
    out,
  );
  return { element, changed };
}

const stale = () => notice("The draft has changed since this backtest: run it again to see the new one.");
const day = (iso) => iso.slice(0, 10);
const count = (n, one, many) => `${n.toLocaleString("en-US")} ${n === 1 ? one : many}`;

// One mark per day on which the draft would have deleted or moved something used later,
// titled with what (at most five named); days outside the series are not marked.
function regretMarks(regrets, days) {
  const byDay = new Map();
  for (const r of regrets) {
    const at = days.indexOf(day(r.would_delete_at));
    if (at >= 0) byDay.set(at, [...(byDay.get(at) || []), r]);
  }
  return [...byDay].map(([x, found]) => {
    const named = found.slice(0, 5).map((r) => `step ${r.step} of ${r.run_id} (${r.action}, then ${r.use.replace("_", " ")})`);
    const more = found.length > 5 ? `, and ${found.length - 5} more` : "";
    return { x, title: `${count(found.length, "regret", "regrets")} on ${days[x]}: ${named.join(", ")}${more}` };
  });
}

function result(answer) {
  const days = answer.series.map((d) => d.day);
  const formatX = (v) => (Math.abs(v - Math.round(v)) < 1e-6 && days[Math.round(v)] ? days[Math.round(v)].slice(5) : "");
  const lines = (pick) => [
    { name: `draft ${answer.policy}`, colour: DRAFT, points: answer.series.map((d, i) => [i, pick(d)]) },
    { name: "what happened", colour: ACTUAL, points: answer.actual.series.map((d, i) => [i, pick(d)]) },
  ];
  const marks = regretMarks(answer.regrets, days);
  const markNote = "dashed: the draft deleted or moved a checkpoint used later (a regret)";
  const span = `from ${day(answer.since)} to ${day(answer.until)}`;
  const saving = answer.savings_usd;
  const last = (series) => series[series.length - 1] || { bytes: 0, usd_month: 0 };
  const regretColumns = [
    ["Checkpoint", (r) => h("code", {}, r.checkpoint_id)],
    ["Run", (r) => h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}` }, r.run_id)],
    ["Step", (r) => String(r.step), { num: true }],
    ["Draft would", (r) => (r.action === "move" ? `move → ${r.to_tier}` : r.action)],
    ["Would delete at", (r) => when(r.would_delete_at)],
    ["Used at", (r) => when(r.used_at)],
    ["Use", (r) => r.use.replace("_", " ")],
  ];
  return h(
    "div",
    {},
    h("p", {}, `${count(answer.runs, "run", "runs")} and ${count(answer.checkpoints, "checkpoint", "checkpoints")} replayed ${span} (UTC): the draft would have made ${count(answer.actions, "delete, move or copy", "deletes, moves and copies")}.`),
    h("p", { class: "stat" }, saving >= 0 ? `Saves ${usd(saving)} ` : `Costs ${usd(-saving)} more `, h("span", { class: "muted small" }, span)),
    h("h3", {}, "Bytes stored, day by day"),
    lineChart(lines((d) => d.bytes), { label: "Bytes stored by day: the draft against what happened", format: bytes, xLabel: "day (UTC)", formatX, marks, markNote }),
    h("h3", {}, "$/month of storage, day by day"),
    lineChart(lines((d) => d.usd_month), { label: "Storage $/month by day: the draft against what happened", format: usd, xLabel: "day (UTC)", formatX, marks, markNote }),
    table(
      [
        ["", (r) => r.name],
        ["Bytes at the end", (r) => bytes(last(r.series).bytes), { num: true }],
        ["$/month at the end", (r) => usd(last(r.series).usd_month), { num: true }],
        ["Storage over the window", (r) => usd(r.total), { num: true }],
      ],
      [
        { name: `draft ${answer.policy}`, series: answer.series, total: answer.total_usd },
        { name: "what happened", series: answer.actual.series, total: answer.actual.total_usd },
      ],
      { label: "Backtest totals" },
    ),
    h("h3", {}, `Regrets (${answer.regrets.length})`),
    table(regretColumns, answer.regrets.slice(0, 500), {
      empty: "No regrets: nothing the draft would have deleted or moved was used afterwards.",
      label: "Regrets",
    }),
    answer.regrets.length > 500 ? h("p", { class: "muted small" }, `The first 500 of ${answer.regrets.length} are listed.`) : null,
    answer.assumptions.length ? h("details", {}, h("summary", {}, "Assumptions"), h("ul", {}, answer.assumptions.map((a) => h("li", {}, String(a))))) : null,
  );
}
