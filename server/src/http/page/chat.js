// Lamina's chat page. Streams /v1/chat/completions (SSE over fetch), shows
// the model and its placement from /props and /v1/models, and the speed of
// the last answer from the server's own timings. Model text only ever goes
// into the DOM through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "lamina.apiKey";
const history = [];
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// A 401 means the server has --api-key and ours is missing or wrong: show
// the key field and keep the message for a resend.
function needKey() {
  $("keyform").hidden = false;
  $("key").focus();
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("log").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

async function loadInfo() {
  try {
    const [models, props] = await Promise.all([
      fetch("v1/models", { headers: headers() }),
      fetch("props", { headers: headers() }),
    ]);
    if (models.status === 401 || props.status === 401) return needKey();
    if (models.status === 503) {
      $("model").textContent = "loading the model…";
      setTimeout(loadInfo, 1000);
      return;
    }
    const m = await models.json();
    const p = await props.json();
    const id = m.data && m.data[0] ? m.data[0].id : "?";
    $("model").textContent = "model: " + id;
    // The placement is the load-time table; its last line sums it up and
    // the whole table is the tooltip.
    const table = (p.placement || "").trim();
    const lines = table.split("\n").filter((l) => l.trim());
    $("placement").textContent = lines.length ? lines[lines.length - 1].trim() : "placement: ?";
    $("placement").title = table;
  } catch (e) {
    $("model").textContent = "cannot reach the server: " + e.message;
  }
}

// Reads an SSE body and calls onEvent with each `data:` payload; events
// are separated by a blank line and may arrive split across chunks.
async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = event
        .split(/\r?\n/)
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (data && onEvent(data) === false) return;
    }
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  controller = new AbortController();
  $("go").disabled = true;
  $("stop").disabled = false;
  $("speed").textContent = "";
  let answer = "";
  let timings = null;
  try {
    const resp = await fetch("v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ messages: history, stream: true }),
      signal: controller.signal,
    });
    if (resp.status === 401) {
      history.pop();
      out.remove();
      needKey();
      return;
    }
    if (!resp.ok) {
      const err = await resp.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || resp.statusText);
    }
    await readEvents(resp.body, (data) => {
      if (data === "[DONE]") return false;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "stream error");
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        answer += delta.content;
        out.textContent = answer;
        out.scrollIntoView({ block: "end" });
      }
      if (chunk.timings) timings = chunk.timings;
      return true;
    });
  } catch (e) {
    if (e.name !== "AbortError") {
      out.classList.add("error");
      out.textContent = answer + (answer ? "\n" : "") + "error: " + e.message;
    }
  } finally {
    controller = null;
    $("go").disabled = false;
    $("stop").disabled = true;
    out.dataset.state = "done";
  }
  if (answer) history.push({ role: "assistant", content: answer });
  if (timings && timings.predicted_n > 0) {
    $("speed").textContent =
      "last answer: " + timings.predicted_n + " tokens, " +
      timings.predicted_per_second.toFixed(1) + " tokens/s";
  } else {
    $("speed").textContent = "last answer: stopped";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("send").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("send").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("keyform").addEventListener("submit", (e) => {
    e.preventDefault();
    localStorage.setItem(KEY, $("key").value.trim());
    $("keyform").hidden = true;
    loadInfo();
  });
  loadInfo();
});
