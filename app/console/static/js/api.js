// The console's only way to the service: the public /v1 API, with the token the user
// gave this tab (sessionStorage: gone when the tab closes, never shared with other tabs).
const KEY = "ckpt-console-token";

export const session = {
  token: sessionStorage.getItem(KEY),
  auth: true, // false when the service runs with CKPT_AUTH=off
  admin: false, // may change data (pin, delete, approve, policies)
  onSignedOut: (message) => {},
};

export class Problem extends Error {
  constructor(status, body) {
    const detail = (body && (body.detail || body.title)) || `HTTP ${status}`;
    super(detail);
    this.status = status;
    this.detail = detail;
    this.field = body && body.field;
    this.errors = (body && Array.isArray(body.errors) && body.errors) || [];
  }
}

export function setToken(token) {
  session.token = token;
  if (token) sessionStorage.setItem(KEY, token);
  else sessionStorage.removeItem(KEY);
}

export function signOut(message) {
  setToken(null);
  session.onSignedOut(message);
}

export async function api(method, path, body, { yaml = false } = {}) {
  const headers = { Accept: "application/json" };
  if (session.token) headers.Authorization = `Bearer ${session.token}`;
  let payload;
  if (body !== undefined) {
    headers["Content-Type"] = yaml ? "application/yaml" : "application/json";
    payload = yaml ? body : JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload, credentials: "omit" });
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { detail: text.slice(0, 300) };
  }
  if (response.status === 401 && session.auth) {
    signOut((data && data.detail) || "The token was refused: sign in again.");
    throw new Problem(401, data);
  }
  if (!response.ok) throw new Problem(response.status, data);
  return data;
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    search.append(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// Every page of a list, up to `most` items (the API answers 1,000 at most per page).
export async function all(path, params = {}, most = 5000) {
  const items = [];
  let cursor = null;
  do {
    const page = await api("GET", path + query({ ...params, limit: 1000, cursor }));
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < most);
  return items;
}

// How this tab may use the service: whether it needs a token, and whether the one it has
// may change data. Asked of the API itself (GET /v1/tokens is for admins only).
export async function probe() {
  const headers = session.token ? { Authorization: `Bearer ${session.token}` } : {};
  const open = await fetch("/v1/tiers?limit=1", { headers: {}, credentials: "omit" });
  session.auth = open.status === 401;
  if (!session.auth) {
    session.admin = true;
    return "ready";
  }
  if (!session.token) return "login";
  const mine = await fetch("/v1/tiers?limit=1", { headers, credentials: "omit" });
  if (mine.status === 401) return "refused";
  const tokens = await fetch("/v1/tokens?limit=1", { headers, credentials: "omit" });
  session.admin = tokens.ok;
  return "ready";
}
