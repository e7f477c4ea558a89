// Policies: the list, and an editor that checks a draft with the service's own validation
// as it is typed (PUT ?dry_run=true stores nothing) and previews what it would change.
import { dump, load } from "../../vendor/js-yaml.mjs";
import { all, api, query, session } from "../api.js";
import { bytes, confirmAction, debounce, h, notice, problemNotice, table, usd, when } from "../ui.js";
import { backtestPanel } from "./backtest.js";

export async function policiesPage() {
  const policies = await all("/v1/policies");
  return h(
    "div",
    {},
    h("h1", {}, "Policies"),
    h(
      "section",
      { class: "card" },
      session.admin ? h("p", {}, h("a", { href: "#/policies/new" }, "New policy")) : null,
      table(
        [
          ["Name", (p) => h("a", { href: `#/policies/${encodeURIComponent(p.name)}` }, p.name)],
          ["Description", (p) => p.policy.description || "–"],
          ["Priority", (p) => String(p.policy.priority ?? 0), { num: true }],
          ["Applies to", (p) => appliesTo(p.policy)],
          ["Rules", (p) => String((p.policy.rules || []).length), { num: true }],
          ["Source", (p) => p.source],
          ["Updated", (p) => `${when(p.updated_at)} by ${p.updated_by}`],
        ],
        policies,
        { empty: "No policy yet: every run keeps everything.", label: "Policies" },
      ),
    ),
  );
}

function appliesTo(policy) {
  const to = policy.applies_to || {};
  const projects = (to.projects || ["*"]).join(", ");
  const labels = Object.entries(to.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  return labels ? `${projects} · ${labels}` : projects;
}

export async function policyPage(params, name) {
  const isNew = name === null;
  const [stored, projects] = await Promise.all([
    isNew ? null : api("GET", `/v1/policies/${encodeURIComponent(name)}`),
    api("GET", "/v1/reports/cost?group_by=project").then((r) => r.rows.map((row) => row.key)),
  ]);
  const nameInput = h("input", { id: "policy-name", name: "name", value: name || "", required: true, pattern: "[a-z0-9][a-z0-9._-]{0,62}", readonly: !isNew });
  const initial = stored ? dump(stored.policy, { lineWidth: 100 }) : TEMPLATE;
  const editor = h("textarea", { id: "policy-yaml", name: "yaml", spellcheck: "false", readonly: !session.admin, "aria-describedby": "policy-check" }, initial);
  editor.value = initial;
  const scope = h("select", { id: "preview-project", name: "project" }, h("option", { value: "" }, "every project"), projects.map((p) => h("option", { value: p }, p)));
  const check = h("div", { id: "policy-check", "aria-live": "polite" });
  const preview = h("div", { id: "policy-preview", "aria-live": "polite" });
  const saved = h("div", { "aria-live": "polite" });
  let previewed = null; // {text, project, diff}

  const currentName = () => (isNew ? nameInput.value.trim() : name);
  const parsed = () => {
    const document = load(editor.value);
    if (!document || typeof document !== "object" || Array.isArray(document)) throw new Error("a policy is a mapping (name, rules, ...)");
    if (!document.name) document.name = currentName();
    return document;
  };

  const validate = async () => {
    if (!session.admin) return;
    const policyName = currentName();
    if (!policyName) {
      check.replaceChildren(notice("Give the policy a name.", "error"));
      return;
    }
    try {
      load(editor.value);
    } catch (error) {
      check.replaceChildren(notice(`YAML: ${error.reason || error.message}${error.mark ? ` (line ${error.mark.line + 1}, column ${error.mark.column + 1})` : ""}`, "error"));
      return;
    }
    try {
      await api("PUT", `/v1/policies/${encodeURIComponent(policyName)}?dry_run=true`, editor.value, { yaml: true });
      check.replaceChildren(notice("Valid.", "ok"));
    } catch (error) {
      check.replaceChildren(problemNotice(error));
    }
  };

  const runPreview = async () => {
    preview.replaceChildren(notice("Planning both versions…"));
    try {
      const project = scope.value || null;
      const after = await api("POST", "/v1/plan", { project, policy: parsed() });
      const before = await api("POST", "/v1/plan", stored ? { project, policy: name } : { project });
      const diff = planDiff(before, after);
      previewed = { text: editor.value, project, diff };
      preview.replaceChildren(diffView(diff, stored ? `the saved ${name}` : "the policies in force"));
      return previewed;
    } catch (error) {
      previewed = null;
      preview.replaceChildren(problemNotice(error));
      return null;
    }
  };

  const save = async () => {
    const policyName = currentName();
    const seen = previewed && previewed.text === editor.value && previewed.project === (scope.value || null) ? previewed : await runPreview();
    if (!seen) return;
    const deletes = seen.diff.after.actions.filter((a) => a.kind === "delete");
    if (deletes.length) {
      const total = deletes.reduce((sum, a) => sum + a.bytes, 0);
      const ok = await confirmAction(`Save ${policyName}?`, `With this policy the next sweep would delete ${deletes.length} checkpoints (${bytes(total)}) in ${seen.project || "every project"}.`, { danger: true, confirmLabel: "Save anyway" });
      if (!ok) return;
    }
    try {
      const answer = await api("PUT", `/v1/policies/${encodeURIComponent(policyName)}`, editor.value, { yaml: true });
      saved.replaceChildren(notice(`Saved ${answer.name} (${when(answer.updated_at)}).`, "ok"));
      if (isNew) window.location.hash = `#/policies/${encodeURIComponent(answer.name)}`;
    } catch (error) {
      saved.replaceChildren(problemNotice(error));
    }
  };

  const backtest = backtestPanel({ draft: parsed, projects });
  const typed = debounce(validate, 350);
  editor.addEventListener("input", () => {
    previewed = null;
    backtest.changed();
    typed();
  });
  nameInput.addEventListener("input", typed);
  validate();
  return h(
    "div",
    {},
    h("p", {}, h("a", { href: "#/policies" }, "← Policies")),
    h("h1", {}, isNew ? "New policy" : `Policy ${name}`),
    h(
      "section",
      { class: "card" },
      h("label", { for: "policy-name" }, "Name", nameInput),
      h("label", { for: "policy-yaml" }, "Policy (YAML)", editor),
      check,
      h(
        "form",
        { class: "filters", onsubmit: (event) => { event.preventDefault(); runPreview(); } },
        h("label", { for: "preview-project" }, "Preview on", scope),
        h("button", { type: "submit", class: "quiet" }, "Preview changes"),
        session.admin ? h("button", { type: "button", onclick: save }, "Save") : null,
      ),
      saved,
    ),
    h("section", { class: "card", "aria-label": "Preview" }, h("h2", {}, "What it would change"), preview),
    backtest.element,
  );
}

const TEMPLATE = `description: what this policy keeps, in a sentence
applies_to: {projects: ["*"]}
priority: 10
rules:
  - name: rolling-keep-3
    class: rolling
    keep_last: 3
    action: delete
`;

const keyOf = (a) => `${a.checkpoint_id}|${a.kind}|${a.to_tier || ""}`;

function planDiff(before, after) {
  const had = new Map(before.actions.map((a) => [keyOf(a), a]));
  const has = new Map(after.actions.map((a) => [keyOf(a), a]));
  const added = after.actions.filter((a) => !had.has(keyOf(a)));
  const removed = before.actions.filter((a) => !has.has(keyOf(a)));
  const tiers = new Set();
  for (const plan of [before, after]) for (const group of Object.values(plan.totals)) if (group && typeof group === "object") Object.keys(group).forEach((t) => tiers.add(t));
  const perTier = [...tiers].sort().map((tier) => ({
    tier,
    deleted: [before.totals.deleted_bytes_by_tier[tier] || 0, after.totals.deleted_bytes_by_tier[tier] || 0],
    moved: [before.totals.moved_bytes_by_tier[tier] || 0, after.totals.moved_bytes_by_tier[tier] || 0],
    usd: [before.totals.usd_month_by_tier[tier] || 0, after.totals.usd_month_by_tier[tier] || 0],
  }));
  return { before, after, added, removed, perTier };
}

function diffView(diff, against) {
  const actionColumns = [
    ["Run", (a) => h("a", { href: `#/runs/${encodeURIComponent(a.run_id)}` }, a.run_id)],
    ["Step", (a) => String(a.step), { num: true }],
    ["Action", (a) => `${a.kind}${a.to_tier ? ` → ${a.to_tier}` : ""}`],
    ["From", (a) => a.from_tier || "–"],
    ["Bytes", (a) => bytes(a.bytes), { num: true }],
    ["$/month", (a) => usd(a.usd_month), { num: true }],
    ["Rule", (a) => a.rule],
  ];
  const pair = ([b, a], format) => (b === a ? format(a) : `${format(b)} → ${format(a)}`);
  return h(
    "div",
    {},
    h("p", {}, `Against ${against}: ${diff.added.length} actions added, ${diff.removed.length} removed; the edited policy plans ${diff.after.actions.length} in all.`),
    table(
      [
        ["Tier", (r) => r.tier],
        ["Deleted", (r) => pair(r.deleted, bytes), { num: true }],
        ["Moved", (r) => pair(r.moved, bytes), { num: true }],
        ["$/month change", (r) => pair(r.usd, usd), { num: true }],
      ],
      diff.perTier,
      { empty: "Neither version plans anything here.", label: "Per tier, before and after" },
    ),
    h("h3", { class: "diff-add" }, `Added (${diff.added.length})`),
    table(actionColumns, diff.added.slice(0, 200), { empty: "None.", label: "Actions added" }),
    h("h3", { class: "diff-remove" }, `Removed (${diff.removed.length})`),
    table(actionColumns, diff.removed.slice(0, 200), { empty: "None.", label: "Actions removed" }),
  );
}
