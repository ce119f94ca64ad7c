// The chat page at GET /: plain HTML and JavaScript, no build step. It keeps the conversation in the
// page and streams each answer from /v1/chat/completions (SSE read through fetch).
#include "server/server.h"

namespace xpert::server {

const char* const kWebChatHtml = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>xpert chat</title>
<link rel="icon" href="data:,">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 0; display: flex; flex-direction: column; height: 100vh; }
  header { padding: 8px 16px; background: #223; color: #eef; display: flex; gap: 12px; align-items: center; }
  header input { width: 14em; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { width: fit-content; max-width: 48em; margin: 0 0 12px; padding: 8px 12px; border-radius: 8px; white-space: pre-wrap; }
  .user { background: #e6efff; margin-left: auto; }
  .assistant { background: #f2f2f2; }
  .error { background: #fde2e2; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid #ddd; }
  textarea { flex: 1; font: inherit; min-height: 3em; }
  #stats { font-size: 12px; color: #aab; margin-left: auto; }
</style>
</head>
<body>
<header><b>xpert</b> <span id="model"></span>
  <label>API key <input id="key" type="password" placeholder="(none)"></label>
  <label>temperature <input id="temp" type="number" value="0.7" min="0" max="2" step="0.1" style="width:4em"></label>
  <label>max tokens <input id="maxtok" type="number" min="1" step="1" placeholder="no limit" style="width:6em"></label>
  <button id="clear" type="button">New chat</button>
  <span id="stats"></span></header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Say something (Enter sends, Shift+Enter adds a line)"></textarea>
  <button id="send">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
const sendBtn = document.getElementById('send'), stopBtn = document.getElementById('stop');
let messages = [], controller = null;
function add(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role; d.textContent = text; log.appendChild(d); log.scrollTop = log.scrollHeight;
  return d;
}
function headers() {
  const h = {'Content-Type': 'application/json'}, k = document.getElementById('key').value;
  if (k) h['Authorization'] = 'Bearer ' + k;
  return h;
}
fetch('/v1/models', {headers: headers()}).then(r => r.json()).then(j => {
  if (j.data) document.getElementById('model').textContent = j.data[0].id;
}).catch(() => {});
function setting(id) {  // a number field: its value, or null (the server's default) when empty
  const v = document.getElementById(id).value;
  return v === '' ? null : Number(v);
}
async function send(text) {
  const conv = messages;  // "New chat" swaps in a new array; this answer belongs to the old one
  conv.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  sendBtn.disabled = true; stopBtn.disabled = false;
  controller = new AbortController();
  const t0 = performance.now(); let n = 0, answer = '';
  try {
    const r = await fetch('/v1/chat/completions', {method: 'POST', headers: headers(), signal: controller.signal,
      body: JSON.stringify({messages: conv, stream: true, temperature: setting('temp'), max_tokens: setting('maxtok')})});
    if (!r.ok) {
      const e = await r.json().catch(() => ({}));
      throw new Error(e.error ? e.error.message : r.status + ' ' + r.statusText);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith('data: ')) continue;
        const data = ev.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const c = j.choices[0] && j.choices[0].delta && j.choices[0].delta.content;
        if (c) { answer += c; n++; out.textContent = answer; log.scrollTop = log.scrollHeight; }
      }
    }
    conv.push({role: 'assistant', content: answer});
    document.getElementById('stats').textContent = n + ' chunks in ' + ((performance.now() - t0) / 1000).toFixed(1) + ' s';
  } catch (e) {
    if (e.name === 'AbortError') { conv.push({role: 'assistant', content: answer}); }
    else { out.className = 'msg error'; out.textContent = 'Error: ' + e.message; conv.pop(); }
  } finally {
    sendBtn.disabled = false; stopBtn.disabled = true; controller = null;
  }
}
document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault();
  const t = input.value.trim();
  if (t && !controller) { input.value = ''; send(t); }
});
input.addEventListener('keydown', e => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); document.getElementById('form').requestSubmit(); }
});
stopBtn.addEventListener('click', () => controller && controller.abort());
document.getElementById('clear').addEventListener('click', () => {
  if (controller) controller.abort();
  messages = []; log.innerHTML = ''; document.getElementById('stats').textContent = '';
});
</script>
</body>
</html>
)HTML";

}  // namespace xpert::server
