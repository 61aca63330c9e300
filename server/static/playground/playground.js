// The ragrank playground: one query, the first stage and the reranked order side by side.
// It calls the public REST API only. Documents' text is always inserted as text (textContent,
// text nodes), never parsed as HTML, so a document cannot run script in this page.
"use strict";

const KEY_STORAGE = "ragrank-api-key"; // sessionStorage: the key lives as long as the tab
const NDCG_AT = 10;
const STAGES = ["embed", "sparse", "retrieve", "rerank"];
const FIELDS = ["query", "top_k", "candidates", "retrieval", "model", "filter"];
const $ = (id) => document.getElementById(id);

const state = { config: null, lastKey: null };

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function headers(json) {
  const result = json ? { "Content-Type": "application/json" } : {};
  const key = $("api-key").value.trim();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

// ---- errors: plain sentences beside the field they are about ----

class ApiError extends Error {
  constructor(status, message, field, retryAfter) {
    super(message);
    this.status = status;
    this.field = field;
    this.retryAfter = retryAfter;
  }
}

async function call(method, path, body) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new ApiError(0, `The server could not be reached (${error.message}).`, null, null);
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch {
    payload = null;
  }
  if (!response.ok) {
    const detail = payload && payload.error ? payload.error : {};
    throw new ApiError(
      response.status,
      detail.message || response.statusText || `HTTP ${response.status}`,
      detail.field || null,
      response.headers.get("Retry-After"),
    );
  }
  return payload;
}

function clearErrors() {
  for (const node of document.querySelectorAll(".error")) node.textContent = "";
  for (const node of document.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
}

function showError(error) {
  let where = "form";
  let sentence = error.message;
  if (error.status === null) {
    where = error.field; // the page's own check, before anything was sent
  } else if (error.status === 400 || error.status === 413) {
    const root = (error.field || "").split(/[.[]/)[0];
    if (FIELDS.includes(root)) where = root;
    sentence = `The server refused this value: ${error.message}`;
  } else if (error.status === 401 || error.status === 403) {
    where = "api-key";
    $("api-key-field").hidden = false;
    sentence = error.status === 401
      ? `This server needs an API key: ${error.message}`
      : `This API key may not do that: ${error.message}`;
  } else if (error.status === 429) {
    const wait = error.retryAfter ? ` Try again in ${error.retryAfter} s.` : " Try again shortly.";
    sentence = `The server is busy: ${error.message}.${wait}`;
  } else if (error.status === 503) {
    sentence = `The server is not ready: ${error.message}`;
  } else if (error.status === 504) {
    sentence = `The search took too long: ${error.message}`;
  } else if (error.status >= 500) {
    sentence = `The server failed on this search: ${error.message}`;
  }
  const target = $(`${where}-error`);
  target.textContent = sentence;
  const input = $(where);
  if (input && where !== "form") input.setAttribute("aria-invalid", "true");
}

// ---- reading the form ----

function integer(id) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : Number(raw);
}

function parseValue(raw) {
  if (/^".*"$/.test(raw)) return raw.slice(1, -1);
  if (raw === "true" || raw === "false") return raw === "true";
  if (/^-?\d+(\.\d+)?$/.test(raw)) return Number(raw);
  return raw;
}

// `lang=fr, topic=coffee`, or a JSON object. Values: numbers, true/false, "quoted" strings.
function parseFilter(text) {
  const raw = text.trim();
  if (raw === "") return undefined;
  if (raw.startsWith("{")) {
    try {
      return JSON.parse(raw);
    } catch (error) {
      throw new ApiError(null, `filter: not valid JSON (${error.message})`, "filter", null);
    }
  }
  const filter = {};
  for (const part of raw.split(",")) {
    const [key, ...rest] = part.split("=");
    if (!rest.length || !key.trim()) {
      throw new ApiError(null, "filter: write key=value pairs separated by commas, or a JSON object",
        "filter", null);
    }
    filter[key.trim()] = parseValue(rest.join("=").trim());
  }
  return filter;
}

function requestBody() {
  const body = { query: $("query").value };
  for (const id of ["top_k", "candidates"]) {
    const value = integer(id);
    if (value !== undefined) body[id] = value;
  }
  if ($("retrieval").value) body.retrieval = $("retrieval").value;
  if ($("model").value) body.model = $("model").value;
  const filter = parseFilter($("filter").value);
  if (filter !== undefined) body.filter = filter;
  return body;
}

// ---- highlighting the words BM25 matched ----
//
// Whole words only, from the browser's own word boundaries (Intl.Segmenter): a search asks
// for `highlight`, and the server lists each hit's words whose stems met the query's BM25
// terms, analysed in the same language it searched with (so stopwords are never marked, and
// "Kinder" is marked for "Kind"). Without that list (a server keeping dense vectors only),
// the query's own words of three letters or more are marked where they occur whole.

const words = new Intl.Segmenter(undefined, { granularity: "word" });

function queryTerms(query) {
  const terms = new Set();
  for (const { segment, isWordLike } of words.segment(query)) {
    const cjk = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u.test(segment);
    if (isWordLike && (segment.length >= 3 || (cjk && segment.length >= 1))) {
      terms.add(segment.toLocaleLowerCase());
    }
  }
  return terms;
}

function highlighted(text, matched, terms) {
  const paragraph = element("p", "text");
  const marked = matched ? new Set(matched.map((word) => word.toLocaleLowerCase())) : terms;
  for (const { segment, isWordLike } of words.segment(text)) {
    if (isWordLike && marked.has(segment.toLocaleLowerCase())) {
      paragraph.append(element("mark", "", segment));
    } else {
      paragraph.append(document.createTextNode(segment));
    }
  }
  paragraph.normalize();
  return paragraph;
}

// ---- labels and NDCG@10 (linear gain, as the eval suite's ranx computes it) ----

function ndcg(hits, relevant, k) {
  const docs = [];
  for (const hit of hits) if (!docs.includes(hit.doc_id)) docs.push(hit.doc_id);
  let dcg = 0;
  docs.slice(0, k).forEach((doc, i) => { dcg += (relevant[doc] || 0) / Math.log2(i + 2); });
  const ideal = Object.values(relevant).filter((g) => g > 0).sort((a, b) => b - a).slice(0, k);
  const idcg = ideal.reduce((sum, g, i) => sum + g / Math.log2(i + 2), 0);
  return idcg > 0 ? dcg / idcg : null;
}

// ---- rendering ----

const hitKey = (hit) => `${hit.doc_id}#${hit.chunk}`;

// The reranker the picker names, as its hub id or folder name.
function rerankerName() {
  if (!state.config) return "cross-encoder";
  const picked = state.config.rerank_models.find((m) => m.name === $("model").value);
  return modelName(picked ? picked.model : state.config.rerank_model);
}

// A hub id ("org/name") as it is; a local model folder by its last name (the full path is long
// and says more about the server's disk than about the model), or by its run's name and
// "model" for the folder `ragrank finetune` writes (RUN/model).
function modelName(id) {
  const parts = id.replace(/\/+$/, "").split("/");
  if (!/^[./~]/.test(id) && parts.length <= 2) return id;
  return parts.slice(parts.at(-1) === "model" ? -2 : -1).join("/");
}

function metadataLine(hit) {
  const parts = [`${hit.doc_id} · chunk ${hit.chunk}`];
  for (const [key, value] of Object.entries(hit.metadata || {})) {
    parts.push(`${key}=${typeof value === "string" ? value : JSON.stringify(value)}`);
  }
  return parts.join(" · ");
}

function renderHit(hit, position, terms, relevant, moveNode, scoreText) {
  const item = element("li", "hit");
  item.dataset.key = hitKey(hit);
  item.dataset.docId = hit.doc_id;
  const head = element("div", "hit-head");
  head.append(element("span", "rank", position));
  head.append(element("span", "title", hit.title || hit.doc_id));
  const grade = relevant[hit.doc_id] || 0;
  if (grade > 0) {
    const mark = element("span", "relevant", `✓ relevant (${grade})`);
    mark.title = "labelled relevant to this query";
    head.append(mark);
  }
  head.append(element("span", "score", scoreText));
  item.append(head, highlighted(hit.text, hit.matched, terms), element("p", "meta", metadataLine(hit)));
  if (moveNode) item.append(moveNode);
  return item;
}

function renderColumns(first, reranked, query, relevant) {
  const terms = queryTerms(query);
  const shownReranked = new Map(reranked.results.map((hit, i) => [hitKey(hit), i + 1]));
  const firstList = $("first-list");
  const rerankedList = $("reranked-list");
  firstList.replaceChildren();
  rerankedList.replaceChildren();

  first.results.forEach((hit, i) => {
    const now = shownReranked.get(hitKey(hit));
    let move;
    if (!reranked.reranked) move = null;
    else if (now === undefined) move = element("p", "move gone", "not in the reranked top_k");
    else move = element("p", `move ${now < i + 1 ? "up" : now > i + 1 ? "down" : "same"}`, `→ #${now} after reranking`);
    firstList.append(renderHit(hit, i + 1, terms, relevant, move, `${first.retrieval} ${hit.retrieval_score.toFixed(3)}`));
  });
  reranked.results.forEach((hit, i) => {
    const was = hit.retrieval_rank;
    const delta = was - (i + 1);
    let move = null;
    if (reranked.reranked) {
      const text = delta > 0 ? `▲ ${delta} (was #${was})` : delta < 0 ? `▼ ${-delta} (was #${was})` : `= (was #${was})`;
      move = element("p", `move ${delta > 0 ? "up" : delta < 0 ? "down" : "same"}`, text);
    }
    const scoreText = reranked.reranked
      ? `rerank ${hit.score.toFixed(3)} · ${reranked.retrieval} ${hit.retrieval_score.toFixed(3)}`
      : `${reranked.retrieval} ${hit.retrieval_score.toFixed(3)}`;
    rerankedList.append(renderHit(hit, i + 1, terms, relevant, move, scoreText));
  });
  if (!first.results.length) firstList.append(element("li", "empty", "No results."));
  if (!reranked.results.length) rerankedList.append(element("li", "empty", "No results."));
  $("first-name").textContent = `(${first.retrieval})`;
  $("reranked-name").textContent = reranked.reranked ? `(${rerankerName()})` : "(not reranked)";
  $("results").hidden = false;
  drawMoves();
}

// Lines from each first-stage result to where reranking put it (wide screens only).
function drawMoves() {
  const svg = $("moves");
  svg.replaceChildren();
  if (getComputedStyle(svg).display === "none") return;
  const box = svg.getBoundingClientRect();
  const targets = new Map();
  for (const item of $("reranked-list").children) targets.set(item.dataset.key, item);
  for (const item of $("first-list").children) {
    const target = targets.get(item.dataset.key);
    if (!target) continue;
    const from = item.getBoundingClientRect();
    const to = target.getBoundingClientRect();
    const y1 = from.top + Math.min(from.height / 2, 14) - box.top;
    const y2 = to.top + Math.min(to.height / 2, 14) - box.top;
    const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
    line.setAttribute("x1", "0");
    line.setAttribute("x2", String(box.width));
    line.setAttribute("y1", String(y1));
    line.setAttribute("y2", String(y2));
    line.setAttribute("class", y2 < y1 - 1 ? "up" : y2 > y1 + 1 ? "down" : "same");
    svg.append(line);
  }
}

function renderTimings(timings) {
  const box = $("timings");
  box.replaceChildren();
  const total = Math.max(timings.total, 0.001);
  const parts = STAGES.map((stage) => [stage, timings[stage] || 0]).filter(([, ms]) => ms > 0);
  const other = Math.max(0, total - parts.reduce((sum, [, ms]) => sum + ms, 0));
  if (other > 0.05) parts.push(["other", other]);
  const bar = element("div", "bar");
  const legend = element("div", "legend");
  for (const [stage, ms] of parts) {
    const segment = element("span", `stage-${stage}`);
    segment.style.width = `${(100 * ms) / total}%`;
    segment.title = `${stage} ${ms.toFixed(1)} ms`;
    bar.append(segment);
    const entry = element("span", "");
    entry.append(element("i", `stage-${stage}`), document.createTextNode(`${stage} ${ms.toFixed(1)} ms`));
    legend.append(entry);
  }
  legend.append(element("span", "", `total ${timings.total.toFixed(1)} ms`));
  box.append(bar, legend);
}

async function labelsFor(query) {
  if (!state.config || !state.config.labels) return { query_id: null, relevant: {} };
  try {
    return await call("GET", `/playground/labels?text=${encodeURIComponent(query)}`);
  } catch {
    return { query_id: null, relevant: {} };
  }
}

function renderLabels(labels, first, reranked) {
  const info = $("label-info");
  const firstMetric = $("first-ndcg");
  const rerankedMetric = $("reranked-ndcg");
  const relevantCount = Object.values(labels.relevant).filter((g) => g > 0).length;
  if (!labels.query_id || !relevantCount) {
    info.hidden = true;
    firstMetric.hidden = true;
    rerankedMetric.hidden = true;
    return;
  }
  info.hidden = false;
  info.textContent = `Labelled query ${labels.query_id} of ${state.config.labels}: ` +
    `${relevantCount} relevant document${relevantCount === 1 ? "" : "s"}, marked ✓.`;
  for (const [node, response] of [[firstMetric, first], [rerankedMetric, reranked]]) {
    const value = ndcg(response.results, labels.relevant, NDCG_AT);
    node.hidden = false;
    node.textContent = `NDCG@${NDCG_AT}: ${value === null ? "n/a" : value.toFixed(3)}`;
    node.dataset.value = value === null ? "" : String(value);
  }
}

// ---- searching ----

async function search(event) {
  if (event) event.preventDefault();
  clearErrors();
  let body;
  try {
    body = requestBody();
  } catch (error) {
    showError(error);
    document.body.dataset.state = "error";
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
  const button = $("search-button");
  button.disabled = true;
  document.body.dataset.state = "searching";
  try {
    // The same body twice: first-stage order, then reranked. `auto` falls back to the first
    // stage's order when the reranker cannot answer, and says why.
    const [first, reranked] = await Promise.all([
      call("POST", "/v1/search", { ...body, rerank: false, highlight: true }),
      call("POST", "/v1/search", { ...body, rerank: "auto", highlight: true }),
    ]);
    const labels = await labelsFor(body.query);
    const notice = $("rerank-notice");
    notice.hidden = reranked.reranked;
    notice.textContent = reranked.reranked ? "" :
      `Not reranked: ${reranked.rerank_error || "the reranker did not answer"}. ` +
      "The right column shows the first stage's order.";
    renderTimings(reranked.timings_ms);
    $("summary").hidden = false;
    renderColumns(first, reranked, body.query, labels.relevant);
    renderLabels(labels, first, reranked);
    document.body.dataset.state = "done";
  } catch (error) {
    showError(error);
    document.body.dataset.state = "error";
  } finally {
    button.disabled = false;
  }
}

async function loadExamples() {
  if (!state.config || !state.config.labels) return;
  const key = $("api-key").value.trim();
  if (state.config.api_keys && !key) return;
  if (state.lastKey === key) return;
  state.lastKey = key;
  let examples;
  try {
    examples = await call("GET", "/playground/examples");
  } catch {
    return;
  }
  const select = $("examples");
  select.replaceChildren(element("option", "", `Pick one of ${examples.length}…`));
  select.firstChild.value = "";
  for (const example of examples) {
    const option = element("option", "", example.text);
    option.value = example.text;
    select.append(option);
  }
  $("examples-field").hidden = examples.length === 0;
}

async function start() {
  const keyInput = $("api-key");
  keyInput.value = sessionStorage.getItem(KEY_STORAGE) || "";
  keyInput.addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORAGE, keyInput.value.trim());
    loadExamples();
  });
  $("search-form").addEventListener("submit", search);
  $("examples").addEventListener("change", (event) => {
    if (!event.target.value) return;
    $("query").value = event.target.value;
    search();
  });
  window.addEventListener("resize", () => drawMoves());
  try {
    state.config = await call("GET", "/playground/config");
  } catch (error) {
    $("server-info").textContent = `The server's settings could not be read: ${error.message}`;
    return;
  }
  const config = state.config;
  $("server-info").textContent = `ragrank ${config.version} · collection ${config.collection} · ` +
    `embedder ${modelName(config.embed_model)} · reranker ${modelName(config.rerank_model)}`;
  $("api-key-field").hidden = !config.api_keys;
  const retrieval = $("retrieval");
  for (const mode of config.retrievals) {
    const option = element("option", "", mode === config.retrieval ? `${mode} (default)` : mode);
    option.value = mode;
    option.selected = mode === config.retrieval;
    retrieval.append(option);
  }
  // The picker, where the server serves more than one reranker; the first is the default.
  const picker = $("model");
  config.rerank_models.forEach((served, i) => {
    const label = `${served.name}${served.name === modelName(served.model) ? "" : ` (${modelName(served.model)})`}`;
    const option = element("option", "", i === 0 ? `${label}, default` : label);
    option.value = served.name;
    picker.append(option);
  });
  $("model-field").hidden = config.rerank_models.length < 2;
  document.body.dataset.state = "ready";
  loadExamples();
  $("query").focus();
}

document.addEventListener("DOMContentLoaded", start);
