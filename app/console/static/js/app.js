// The console's shell: who is signed in, the navigation, and which page the address shows.
import { probe, session, setToken } from "./api.js";
import { h, notice, problemNotice } from "./ui.js";
import { overviewPage } from "./pages/overview.js";
import { runsPage, runPage } from "./pages/runs.js";
import { policiesPage, policyPage } from "./pages/policies.js";
import { forecastPage } from "./pages/forecast.js";
import { ledgerPage, auditPage } from "./pages/ledger.js";

const view = document.getElementById("view");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const signOutButton = document.getElementById("sign-out");

const ROUTES = [
  [/^\/$/, overviewPage],
  [/^\/runs$/, runsPage],
  [/^\/runs\/([^/]+)$/, runPage],
  [/^\/policies$/, policiesPage],
  [/^\/policies\/new$/, (params) => policyPage(params, null)],
  [/^\/policies\/([^/]+)$/, policyPage],
  [/^\/forecast$/, forecastPage],
  [/^\/ledger$/, ledgerPage],
  [/^\/audit$/, auditPage],
];

function location() {
  const raw = window.location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = raw.split("?");
  return { path, params: new URLSearchParams(search) };
}

let signedOutMessage = null;
session.onSignedOut = (message) => {
  signedOutMessage = message;
  showLogin();
};

function showLogin() {
  nav.hidden = true;
  signOutButton.hidden = true;
  who.textContent = "";
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const out = h("div");
  const form = h(
    "form",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        setToken(input.value.trim());
        const state = await probe();
        if (state === "ready") {
          signedOutMessage = null;
          render();
        } else {
          setToken(null);
          out.replaceChildren(notice("That token was refused: check it and try again.", "error"));
        }
      },
    },
    h("label", { for: "token" }, "API token", input),
    h("button", { type: "submit" }, "Sign in"),
  );
  view.replaceChildren(
    h(
      "section",
      { class: "card login" },
      h("h1", {}, "Sign in"),
      h("p", { class: "muted" }, "Paste an API token. It is kept for this browser tab only."),
      signedOutMessage ? notice(signedOutMessage, "error") : null,
      form,
      out,
    ),
  );
  input.focus();
}

async function render() {
  const { path, params } = location();
  if (session.auth && !session.token) return showLogin();
  nav.hidden = false;
  signOutButton.hidden = !session.auth;
  who.textContent = session.auth ? (session.admin ? "signed in · admin" : "signed in · read only") : "authentication off";
  for (const link of nav.querySelectorAll("a")) {
    const target = link.getAttribute("href").slice(1);
    const current = target === "/" ? path === "/" : path === target || path.startsWith(`${target}/`);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  for (const [pattern, page] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    view.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    try {
      const content = await page(params, ...match.slice(1).map(decodeURIComponent));
      if (location().path === path) view.replaceChildren(content);
    } catch (error) {
      if (session.auth && !session.token) return; // signed out by a 401: the form is shown
      view.replaceChildren(h("h1", {}, "Something went wrong"), problemNotice(error));
    }
    view.focus({ preventScroll: true });
    return;
  }
  view.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
}

signOutButton.addEventListener("click", () => {
  setToken(null);
  signedOutMessage = null;
  showLogin();
});
window.addEventListener("hashchange", render);

const state = await probe();
if (state === "refused") {
  setToken(null);
  signedOutMessage = "The saved token was refused: sign in again.";
}
render();
