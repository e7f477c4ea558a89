// Forecast: what a run will store and cost under a policy, beside keeping everything.
import { all, api } from "../api.js";
import { lineChart } from "../charts.js";
import { bytes, h, problemNotice, table, usd } from "../ui.js";

export async function forecastPage() {
  const policies = await all("/v1/policies");
  const field = (id, label, attrs) => h("label", { for: id }, label, h("input", { id, name: id, ...attrs }));
  const form = h(
    "form",
    { class: "filters", "aria-label": "Forecast" },
    field("fc-size", "Checkpoint size (GB)", { type: "number", min: "0.001", step: "any", value: "1000", required: true }),
    field("fc-days", "Run days", { type: "number", min: "1", value: "45", required: true }),
    field("fc-rolling", "Rolling every", { value: "3h", placeholder: "e.g. 3h" }),
    field("fc-milestone", "Milestone every", { value: "1d", placeholder: "e.g. 1d" }),
    h("label", { for: "fc-final" }, "Final at the end", h("select", { id: "fc-final", name: "final" }, h("option", { value: "end" }, "yes"), h("option", { value: "" }, "no"))),
    h("label", { for: "fc-policy" }, "Policy", h("select", { id: "fc-policy", name: "policy" }, policies.map((p) => h("option", { value: p.name }, p.name)))),
    field("fc-runs", "Concurrent runs", { type: "number", min: "1", value: "1" }),
    field("fc-horizon", "Horizon days", { type: "number", min: "1", placeholder: "run + 30" }),
    h("button", { type: "submit" }, "Forecast"),
  );
  const out = h("div", { "aria-live": "polite" });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = (id) => form.querySelector(`#${id}`).value.trim();
    const schedule = {};
    if (value("fc-rolling")) schedule.rolling = value("fc-rolling");
    if (value("fc-milestone")) schedule.milestone = value("fc-milestone");
    if (value("fc-final")) schedule.final = "end";
    const body = {
      checkpoint_bytes: Math.round(Number(value("fc-size")) * 1e9),
      run_days: Number(value("fc-days")),
      schedule,
      policy: value("fc-policy") || null,
      concurrent_runs: Number(value("fc-runs") || 1),
    };
    if (value("fc-horizon")) body.horizon_days = Number(value("fc-horizon"));
    out.replaceChildren(h("p", { class: "muted" }, "Simulating…"));
    try {
      out.replaceChildren(result(await api("POST", "/v1/forecast", body)));
    } catch (error) {
      out.replaceChildren(problemNotice(error));
    }
  });
  return h("div", {}, h("h1", {}, "Forecast"), h("section", { class: "card" }, form), out);
}

function result(forecast) {
  const keep = forecast.keep_everything;
  const chart = lineChart(
    [
      { name: `policy ${forecast.policy}`, colour: "#1f5fbf", points: forecast.series.map((d) => [d.day, d.usd_month]) },
      { name: "keep everything", colour: "#c0392b", points: keep.series.map((d) => [d.day, d.usd_month]) },
    ],
    { label: "Storage $/month by day: the policy against keeping everything", format: usd },
  );
  return h(
    "div",
    {},
    h(
      "section",
      { class: "card" },
      h("h2", {}, "$/month of storage, day by day"),
      chart,
      table(
        [
          ["", (r) => r.name],
          ["At run end", (r) => bytes(r.at.bytes), { num: true }],
          ["$/month at run end", (r) => usd(r.at.usd_month), { num: true }],
          ["Total over the horizon", (r) => usd(r.total), { num: true }],
        ],
        [
          { name: `policy ${forecast.policy}`, at: forecast.at_run_end, total: forecast.total_usd },
          { name: "keep everything", at: keep.at_run_end, total: keep.total_usd },
        ],
        { label: "Forecast summary" },
      ),
      h("p", { class: "stat" }, `Saves ${usd(forecast.savings_usd)} over ${forecast.horizon_days} days`),
      forecast.assumptions.length ? h("details", {}, h("summary", {}, "Assumptions"), h("ul", {}, forecast.assumptions.map((a) => h("li", {}, String(a))))) : null,
    ),
  );
}
