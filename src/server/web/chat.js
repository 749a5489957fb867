// The chat page of `kestrel serve`: streams /v1/chat/completions (SSE) into the DOM. Text is only ever
// set through textContent (no HTML from the model reaches the page). Stop aborts the fetch; the server
// cancels the generation when the connection closes.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { messages: [], controller: null, model: null };

function requestHeaders() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function errorText(response) {
  try {
    const j = await response.json();
    if (j && j.error && j.error.message) return j.error.message;
  } catch (e) { /* not JSON */ }
  return "HTTP " + response.status;
}

async function loadModel() {
  const line = $("model-line");
  try {
    const r = await fetch("/v1/models", { headers: requestHeaders() });
    if (r.status === 401) {
      line.textContent = "This server requires an API key: paste it above.";
      return false;
    }
    if (!r.ok) throw new Error(await errorText(r));
    const m = (await r.json()).data[0];
    state.model = m.id;
    $("model-name").textContent = m.id;
    let text = "Loaded: " + m.id;
    if (m.root) text += " from " + m.root;
    if (m.max_model_len) text += ", context " + m.max_model_len + " tokens";
    if (m.random_weights) text += ". Random weights: the replies are not meaningful text.";
    line.textContent = text;
    return true;
  } catch (e) {
    line.textContent = "Cannot reach the server: " + (e.message || e);
    return false;
  }
}

// One message bubble; the assistant's has a collapsed reasoning block, tool calls and a state line.
function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role === "user" ? "You" : state.model || "assistant";
  el.append(label);
  const details = document.createElement("details");
  details.className = "reasoning";
  details.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const reasoning = document.createElement("div");
  reasoning.className = "reasoning-text";
  details.append(summary, reasoning);
  const tools = document.createElement("div");
  tools.className = "tools";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text || "";
  const status = document.createElement("div");
  status.className = "state";
  el.append(details, tools, content, status);
  $("messages").append(el);
  scrollDown();
  return {
    el,
    reasoning(t) { details.hidden = false; reasoning.textContent = t; scrollDown(); },
    content(t) { content.textContent = t; scrollDown(); },
    tools(calls) {
      tools.replaceChildren(...calls.filter(Boolean).map((c) => {
        const d = document.createElement("div");
        d.className = "tool-call";
        d.textContent = "tool call: " + c.function.name + "(" + c.function.arguments + ")";
        return d;
      }));
      scrollDown();
    },
    finish(stateName, text) { el.dataset.state = stateName; status.textContent = text; },
  };
}

function scrollDown() {
  const m = $("messages");
  m.scrollTop = m.scrollHeight;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("input").disabled = busy;
}

// Calls onEvent(parsed JSON) for every `data:` event of an SSE body until [DONE] or the end.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  if (!state.model && !(await loadModel())) return;  // the text stays in the input box
  $("input").value = "";
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const view = addMessage("assistant");
  view.el.dataset.state = "streaming";
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  $("status").textContent = "Generating…";
  let content = "", reasoning = "", finish = null, chunks = 0;
  const calls = [];
  const started = performance.now();
  try {
    const body = {
      model: state.model,
      messages: state.messages,
      stream: true,
      max_tokens: Number($("max-tokens").value) || 256,
      temperature: Number($("temperature").value),
      chat_template_kwargs: { thinking: $("thinking").checked },
    };
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: requestHeaders(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      const d = choice.delta || {};
      ++chunks;
      if (d.reasoning_content) view.reasoning(reasoning += d.reasoning_content);
      if (d.content) view.content(content += d.content);
      for (const tc of d.tool_calls || []) {
        const i = tc.index || 0;
        const c = calls[i] || (calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
        if (tc.id) c.id = tc.id;
        if (tc.function && tc.function.name) c.function.name += tc.function.name;
        if (tc.function && tc.function.arguments) c.function.arguments += tc.function.arguments;
        view.tools(calls);
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    });
    const secs = (performance.now() - started) / 1000;
    view.finish("done", "finished: " + (finish || "end of stream") + ", " + chunks + " chunks in " + secs.toFixed(1) + " s");
  } catch (e) {
    if (e.name === "AbortError") view.finish("stopped", "stopped");
    else view.finish("error", "error: " + (e.message || e));
  } finally {
    state.controller = null;
    setBusy(false);
    $("status").textContent = "";
    $("input").focus();
  }
  // Only the visible answer goes back into the conversation (not the reasoning, not unanswered tool calls).
  if (content) state.messages.push({ role: "assistant", content });
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || state.controller) return;
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
$("clear").addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  state.messages = [];
  $("messages").replaceChildren();
});
$("api-key").value = sessionStorage.getItem("kestrel-api-key") || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem("kestrel-api-key", $("api-key").value.trim());
  loadModel();
});
loadModel();
