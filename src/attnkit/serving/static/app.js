// attnkit playground: plain JavaScript, no build step, no network beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);
let info = null;
let attention = null;
// A server started with --api-key answers 401 without it: the page asks for the key once and keeps it for the tab.
let apiKey = sessionStorage.getItem("attnkit-api-key") || "";

async function api(path, body) {
  const headers = apiKey ? {"Authorization": `Bearer ${apiKey}`} : {};
  const response = await fetch(path, body === undefined ? {headers: headers} : {
    method: "POST", headers: {...headers, "Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const message = data && data.error ? `${data.error_type}: ${data.error}` : `HTTP ${response.status}`;
    const err = new Error(`${path} answered ${response.status}. ${message}`);
    err.status = response.status;
    throw err;
  }
  return data;
}

function askForKey() {
  $("key-form").hidden = false;
  $("key").focus();
  return new Promise((resolve) => {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      apiKey = $("key").value;
      sessionStorage.setItem("attnkit-api-key", apiKey);
      $("key-form").hidden = true;
      resolve();
    }, {once: true});
  });
}

function showError(err) {
  const box = $("error");
  box.textContent = err ? String(err.message || err) : "";
  box.hidden = !err;
}

async function loadInfo() {
  for (let attempt = 0; attempt < 60; attempt++) {  // the model may still be loading: /info answers 503
    try {
      info = await api("/info");
      break;
    } catch (err) {
      $("model-info").textContent = String(err.message);
      if (err.status === 401) await askForKey();
      else await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
  if (!info) return;
  const c = info.config;
  $("model-info").textContent = `${info.task} ${info.model}: ${info.n_layers} layers x ${info.n_heads} heads, ` +
    `d_model ${c.d_model}, max ${info.max_len} tokens` + (info.labels ? `, labels ${info.labels.join(", ")}` : "") +
    ` (${info.inference.precision} on ${info.inference.device})`;
  $("decoding").hidden = info.task !== "translator";
}

function bars(probs) {
  const box = $("classes");
  box.innerHTML = "";
  const best = Object.keys(probs).reduce((a, b) => (probs[a] >= probs[b] ? a : b));
  for (const [label, p] of Object.entries(probs)) {
    const row = document.createElement("div");
    row.className = "bar-row" + (label === best ? " best" : "");
    row.dataset.label = label;
    row.dataset.prob = String(p);  // the API's number, unrounded (the browser test compares it)
    row.innerHTML = `<span class="bar-label"></span><div class="bar-track"><div class="bar"></div></div>` +
      `<span class="bar-value"></span>`;
    row.querySelector(".bar-label").textContent = label;
    row.querySelector(".bar").style.width = `${(100 * p).toFixed(2)}%`;
    row.querySelector(".bar-value").textContent = `${(100 * p).toFixed(2)}%`;
    box.appendChild(row);
  }
  $("classes-section").hidden = false;
}

function tokens(list) {
  const box = $("tokens");
  box.innerHTML = "";
  for (const t of list) {
    const span = document.createElement("span");
    span.className = "token";
    if (/^(<unk>|\[UNK\])$/.test(t)) span.classList.add("unk");
    else if (/^(<.*>|\[.*\])$/.test(t)) span.classList.add("special");
    span.textContent = t;
    box.appendChild(span);
  }
  $("tokens-section").hidden = false;
}

function translation(result) {
  $("translation").textContent = result.translation;
  const body = document.querySelector("#nbest tbody");
  body.innerHTML = "";
  result.n_best.forEach((cand, i) => {
    const row = document.createElement("tr");
    const fmt = (x) => (x === null ? "-inf" : x.toFixed(4));
    row.innerHTML = `<td>${i + 1}</td><td></td><td class="num">${fmt(cand.score)}</td>` +
      `<td class="num">${fmt(cand.normalized_score)}</td>`;
    row.children[1].textContent = cand.translation;
    body.appendChild(row);
  });
  $("translation-section").hidden = false;
}

function meanOverHeads(heads) {
  const n = heads.length;
  return heads[0].map((row, q) => row.map((_, k) => heads.reduce((s, h) => s + h[q][k], 0) / n));
}

function draw(canvas, matrix, cell) {
  const rows = matrix.length, cols = matrix[0].length;
  canvas.width = cols * cell;
  canvas.height = rows * cell;
  const ctx = canvas.getContext("2d");
  // Each map is scaled to its own largest weight: a row of 30 keys rarely gives one more than 0.3.
  const top = Math.max(1e-9, ...matrix.map((row) => Math.max(...row)));
  for (let q = 0; q < rows; q++) {
    for (let k = 0; k < cols; k++) {
      const v = Math.max(0, Math.min(1, matrix[q][k] / top));
      const shade = Math.round(255 * (1 - v));
      ctx.fillStyle = `rgb(${shade}, ${Math.round(255 - 190 * v)}, ${Math.round(255 - 60 * v)})`;
      ctx.fillRect(k * cell, q * cell, cell, cell);
    }
  }
}

// Axis labels of each kind of map: (query tokens, key tokens).
function axes(kind) {
  if (kind === "encoder_self") return [attention.tokens, attention.tokens];
  const out = attention.output_tokens, dec = attention.input_tokens_decoder;
  if (kind === "cross") return [out, attention.tokens];
  return [dec, dec];
}

function detail(kind, layer, head, matrix) {
  const [queries, keys] = axes(kind);
  const cell = Math.max(14, Math.min(40, Math.floor(640 / Math.max(queries.length, keys.length))));
  const margin = 110;
  const canvas = $("detail-canvas");
  canvas.width = margin + keys.length * cell;
  canvas.height = margin + queries.length * cell;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const heat = document.createElement("canvas");
  draw(heat, matrix, cell);
  ctx.drawImage(heat, margin, margin);
  ctx.fillStyle = "#222";
  ctx.font = "12px monospace";
  ctx.textAlign = "right";
  queries.forEach((t, q) => ctx.fillText(t, margin - 4, margin + q * cell + cell * 0.7));
  keys.forEach((t, k) => {
    ctx.save();
    ctx.translate(margin + k * cell + cell * 0.7, margin - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(t, 0, 0);
    ctx.restore();
  });
  const what = head === null ? "mean over heads" : `head ${head}`;
  $("detail-title").textContent = `${kind.replace("_", " ")}, layer ${layer}, ${what} (rows: queries, columns: keys)`;
  $("detail").hidden = false;
}

function grid() {
  const kind = $("kind").value;
  const layers = attention[kind];
  const box = $("grid");
  box.innerHTML = "";
  const nHeads = layers[0].length;
  box.style.gridTemplateColumns = `3.5rem repeat(${nHeads + 1}, 92px)`;
  box.appendChild(document.createElement("span"));
  for (let h = 0; h < nHeads; h++) {
    const label = document.createElement("span");
    label.className = "grid-label";
    label.textContent = `head ${h}`;
    box.appendChild(label);
  }
  const meanLabel = document.createElement("span");
  meanLabel.className = "grid-label";
  meanLabel.textContent = "mean";
  box.appendChild(meanLabel);
  layers.forEach((heads, layer) => {
    const label = document.createElement("span");
    label.className = "grid-label";
    label.textContent = `layer ${layer}`;
    box.appendChild(label);
    const cell = Math.max(1, Math.floor(90 / heads[0].length));
    heads.forEach((matrix, head) => {
      const canvas = document.createElement("canvas");
      canvas.className = "map";
      canvas.dataset.layer = layer;
      canvas.dataset.head = head;
      draw(canvas, matrix, cell);
      canvas.addEventListener("click", () => detail(kind, layer, head, matrix));
      box.appendChild(canvas);
    });
    const mean = meanOverHeads(heads);
    const canvas = document.createElement("canvas");
    canvas.className = "map mean";
    canvas.dataset.layer = layer;
    draw(canvas, mean, cell);
    canvas.addEventListener("click", () => detail(kind, layer, null, mean));
    box.appendChild(canvas);
  });
  $("attention-section").hidden = false;
  $("detail").hidden = true;
}

function showAttention(maps) {
  attention = maps;
  const select = $("kind");
  select.innerHTML = "";
  const kinds = [["encoder_self", "encoder self-attention"], ["decoder_self", "decoder self-attention"],
                 ["cross", "cross-attention (alignment)"]].filter(([k]) => maps[k]);
  for (const [value, label] of kinds) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label;
    select.appendChild(option);
  }
  if (maps.cross) select.value = "cross";
  grid();
  tokens(maps.tokens);
}

async function run(event) {
  event.preventDefault();
  showError(null);
  for (const id of ["classes-section", "translation-section", "tokens-section", "attention-section"]) $(id).hidden = true;
  document.body.dataset.state = "running";
  const text = $("text").value;
  const errors = [];
  const jobs = [];
  if (info && info.task === "classifier") {
    jobs.push(api("/v1/classify", {inputs: text}).then((r) => bars(r.results[0].probs)).catch((e) => errors.push(e)));
  }
  if (info && info.task === "translator") {
    const beam = Number($("beam").value), nBest = Number($("nbest").value);
    const body = {inputs: text, beam: beam, alpha: Number($("alpha").value), n_best: Math.min(nBest, beam)};
    jobs.push(api("/v1/translate", body).then((r) => translation(r.results[0])).catch((e) => errors.push(e)));
  }
  jobs.push(api("/v1/attention", {inputs: text}).then(showAttention).catch((e) => errors.push(e)));
  await Promise.all(jobs);
  if (errors.length) showError({message: errors.map((e) => e.message).join("\n")});
  document.body.dataset.state = "done";
}

$("form").addEventListener("submit", run);
$("kind").addEventListener("change", grid);
loadInfo();
