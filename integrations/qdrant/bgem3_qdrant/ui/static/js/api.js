// The page's JSON API: same origin only (the Content-Security-Policy allows nothing else).

const KEY = "bgem3-ui-key";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

export async function api(path, body) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method: body === undefined ? "GET" : "POST", headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "the page's server does not answer: is `bgem3-qdrant ui` still running?");
  }
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  if (!response.ok) {
    const error = data && data.error;
    const message = (error && (error.message || error)) || `HTTP ${response.status} from ${path}`;
    throw new ApiError(response.status, String(message));
  }
  return data;
}
