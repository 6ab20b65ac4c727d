// postcast's forecast page: every request goes to the server that sent the page (no CDN, no tiles).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { listing: null, law: null, axes: null, extent: null, mapUrl: null, lawKey: null };

async function getJSON(url) {
  const r = await fetch(url);
  const body = await r.json();
  if (!r.ok) throw new Error(body.detail || r.statusText);
  return body;
}

function query(params) {
  const kept = Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== "");
  return new URLSearchParams(kept).toString();
}

function fill(select, items, keep) {
  const old = keep ? select.value : null;
  select.innerHTML = "";
  for (const [value, text] of items) select.add(new Option(text, value));
  if (old !== null && items.some(([v]) => v === old)) select.value = old;
}

const fmt = (x) => (Math.abs(x) >= 1000 || (Math.abs(x) < 0.01 && x !== 0) ? x.toExponential(3) : x.toPrecision(4));
const hour = (iso) => iso.slice(0, 13).replace("T", " ") + " UTC";
const targetInfo = () => state.listing.targets.find((t) => t.target === $("target").value);

function fillModels() {
  const t = targetInfo();
  const scored = t.chosen_by.startsWith("the lowest");
  fill($("model"), t.models.map((m, k) => {
    const crps = m.crps === null ? "not verified" : `CRPS ${fmt(m.crps)} ${t.units || ""}`;
    const mark = k === 0 ? (scored ? "best-verified, " : "default, ") : "";
    return [m.model, `${m.model} (${mark}${crps})`];
  }));
  fillTimes();
}

function fillTimes() {
  const rows = state.listing.forecasts.filter((f) => f.target === $("target").value && f.model === $("model").value);
  const byValid = new Map(rows.map((f) => [f.valid_time, f]));
  const items = [...byValid.values()].reverse().map((f) => {
    const lead = Math.round((Date.parse(f.valid_time) - Date.parse(f.init_time)) / 3.6e6);
    return [f.valid_time, `${hour(f.init_time)} +${lead} h (valid ${hour(f.valid_time)})`];
  });
  fill($("time"), items, true);
}

function selection() {
  return { target: $("target").value, model: $("model").value, time: $("time").value };
}

function showLaw(info) {
  const l = info.law;
  const note = l.note ? ` <span class="note">Note: ${l.note}.</span>` : "";
  $("law").innerHTML =
    `<b>${info.model}</b> (${info.product}): <b>${l.family}</b> law, ${l.definition}; units ${l.units}; ` +
    `lead +${info.lead_h} h. Thresholds: ${l.thresholds.says}.${note}`;
  const level = state.law && state.law !== info ? $("level").value : "0.5"; // the median first
  fill($("level"), info.quantile_levels.map((q) => [String(q), `${+(100 * q).toFixed(3)} %`]));
  if (info.quantile_levels.map(String).includes(level)) $("level").value = level;
  fill($("threshold"), info.thresholds.map((t) => [String(t), `${fmt(t)} ${l.units}`]), true);
}

function mapParams() {
  const show = $("show").value;
  $("level-box").hidden = show !== "quantile";
  $("threshold-box").hidden = show !== "probability";
  const p = { ...selection(), show };
  if (show === "quantile") p.level = $("level").value;
  if (show === "probability") p.threshold = $("threshold-typed").value || $("threshold").value;
  return p;
}

async function drawMap() {
  const q = query(mapParams());
  const r = await fetch(`/map.png?${q}`);
  if (!r.ok) throw new Error((await r.json()).detail);
  state.axes = r.headers.get("X-Map-Axes").split(",").map(Number);
  state.extent = r.headers.get("X-Map-Extent").split(",").map(Number);
  if (state.mapUrl) URL.revokeObjectURL(state.mapUrl);
  state.mapUrl = URL.createObjectURL(await r.blob());
  const img = $("map");
  img.src = state.mapUrl;
  img.dataset.query = q;
}

async function update() {
  $("error").textContent = "";
  try {
    const key = query(selection());
    if (key !== state.lawKey) {
      const info = await getJSON(`/forecast/law?${key}`);
      showLaw(info);
      state.law = info;
      state.lawKey = key;
    }
    await drawMap();
  } catch (err) {
    $("error").textContent = String(err.message || err);
  }
}

function where(ev) {
  const img = $("map");
  const fx = ev.offsetX / img.clientWidth, fy = ev.offsetY / img.clientHeight;
  const [left, top, right, bottom] = state.axes, [west, east, south, north] = state.extent;
  if (fx < left || fx > right || fy < top || fy > bottom) return null;
  return {
    lat: north - ((fy - top) / (bottom - top)) * (north - south),
    lon: west + ((fx - left) / (right - left)) * (east - west),
  };
}

function membersSvg(members, x, y) {
  // the raw members' empirical CDF (a step each) and a rug of ticks on the axis
  if (!members.length) return "";
  const m = [...members].sort((a, b) => a - b), n = m.length;
  const steps = m.map((v, k) => `${x(v).toFixed(1)},${y(k / n).toFixed(1)} ${x(v).toFixed(1)},${y((k + 1) / n).toFixed(1)}`);
  const rug = m.map((v) => `<line x1="${x(v)}" x2="${x(v)}" y1="${y(0)}" y2="${y(0) - 8}"/>`).join("");
  return `<polyline id="members" points="${steps.join(" ")}" fill="none" stroke="#e67e22" stroke-width="1.5"/><g stroke="#e67e22">${rug}</g>`;
}

function cdfSvg(levels, values, thresholds, units, members) {
  const W = 420, H = 240, L = 50, R = 10, T = 10, B = 40;
  const xs = values.concat(thresholds, members), lo = Math.min(...xs), hi = Math.max(...xs), pad = (hi - lo) * 0.05 || 1;
  const x = (v) => L + ((v - lo + pad) / (hi - lo + 2 * pad)) * (W - L - R);
  const y = (p) => T + (1 - p) * (H - T - B);
  const pts = values.map((v, k) => `${x(v).toFixed(1)},${y(levels[k]).toFixed(1)}`).join(" ");
  const dots = values.map((v, k) => `<circle cx="${x(v)}" cy="${y(levels[k])}" r="3"/>`).join("");
  const thr = thresholds.map((t) => `<line x1="${x(t)}" x2="${x(t)}" y1="${T}" y2="${H - B}" stroke="#c33" stroke-dasharray="4 3"/>`).join("");
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((p) => `<text x="${L - 6}" y="${y(p) + 4}" text-anchor="end">${p}</text>`).join("");
  return (
    `<svg id="cdf" width="${W}" height="${H}" font-size="11"><rect x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}" fill="none" stroke="#999"/>` +
    `${thr}${membersSvg(members, x, y)}<polyline points="${pts}" fill="none" stroke="#1f77b4" stroke-width="2"/><g fill="#1f77b4">${dots}</g>${ticks}` +
    `<text x="${L}" y="${H - 22}">${fmt(lo)}</text><text x="${W - R}" y="${H - 22}" text-anchor="end">${fmt(hi)}</text>` +
    `<text x="${(L + W) / 2}" y="${H - 6}" text-anchor="middle">value (${units}); dashed: thresholds</text>` +
    `<text x="12" y="${(T + H - B) / 2}" transform="rotate(-90 12 ${(T + H - B) / 2})" text-anchor="middle">P(Y &#8804; value)</text></svg>`
  );
}

function showPoint(a) {
  const levels = Object.keys(a.quantiles).map(Number), values = Object.values(a.quantiles);
  const thresholds = Object.keys(a.exceedance).map(Number);
  const qRows = levels.map((q, k) => `<tr><td>${+(100 * q).toFixed(3)} %</td><td>${fmt(values[k])}</td></tr>`).join("");
  const eRows = Object.entries(a.exceedance).map(([t, p]) => `<tr><td>&gt; ${t}</td><td>${(100 * p).toFixed(1)} %</td></tr>`).join("");
  const note = a.law.note ? `<p class="note">Note: ${a.law.note}.</p>` : "";
  const members = a.members || [];
  const raw = members.length
    ? ` Orange: the ${members.length} raw members (before post-processing), their empirical CDF and a tick each.`
    : " (This file does not store the raw members.)";
  $("point").innerHTML =
    `<h2>${a.target} at ${a.latitude.toFixed(2)}&deg;N, ${a.longitude.toFixed(2)}&deg;E: ${a.law.family} law (${a.law.definition})</h2>` +
    `<p>${a.model} (${a.product}), valid ${hour(a.valid_time)}; mean ${fmt(a.mean)} ${a.units}, std ${fmt(a.std)} ${a.units}. ` +
    `Blue: the predictive CDF from the law's quantiles; thresholds: ${a.law.thresholds.says}.${raw}</p>${note}` +
    cdfSvg(levels, values, thresholds, a.units, members) +
    `<table id="quantiles"><tr><th>level</th><th>quantile (${a.units})</th></tr>${qRows}</table>` +
    `<table id="exceedance"><tr><th>threshold (${a.units})</th><th>P(exceed)</th></tr>${eRows}</table>`;
}

async function clickMap(ev) {
  const at = where(ev);
  if (!at) return;
  const typed = $("threshold-typed").value;
  try {
    showPoint(await getJSON(`/forecast/point?${query({ ...selection(), lat: at.lat.toFixed(3), lon: at.lon.toFixed(3), threshold: typed })}`));
  } catch (err) {
    $("error").textContent = String(err.message || err);
  }
}

async function start() {
  try {
    state.listing = await getJSON("/forecasts");
  } catch (err) {
    $("error").textContent = String(err.message || err);
    return;
  }
  if (!state.listing.targets.length) {
    $("error").textContent = "no forecast in the archive";
    return;
  }
  fill($("target"), state.listing.targets.map((t) => [t.target, t.target]));
  $("target").onchange = () => { fillModels(); update(); };
  $("model").onchange = () => { fillTimes(); update(); };
  for (const id of ["time", "show", "level", "threshold", "threshold-typed"]) $(id).onchange = update;
  $("map").onclick = clickMap;
  fillModels();
  await update();
  document.body.dataset.ready = "1";
}

start();
