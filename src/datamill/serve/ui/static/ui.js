// datamill serve: the UI's only script (no third-party code). Two jobs, both fetch + polling:
// 1. an iteration page re-renders its live section (server-rendered HTML) every second;
// 2. a column's "Top values & histogram" button loads the server-rendered result, polling while
//    the server is still reading shards (a progress bar is shown meanwhile).
"use strict";

function poll(url, target, { every = 1000, until = () => false, maxMs = 6 * 3600 * 1000 } = {}) {
  const started = Date.now();
  async function tick() {
    if (Date.now() - started > maxMs) return;
    let stop = false;
    try {
      const res = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (res.status === 401) { window.location.reload(); return; }
      target.innerHTML = await res.text();
      stop = until(target);
    } catch (err) {
      target.setAttribute("data-error", String(err));
    }
    if (!stop) setTimeout(tick, document.hidden ? every * 5 : every);
  }
  tick();
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.querySelector("[data-live]");
  if (live) {
    poll(live.getAttribute("data-live"), live, { every: 1000 });
  }
  for (const button of document.querySelectorAll("button.values[data-url]")) {
    button.addEventListener("click", () => {
      const out = document.getElementById(button.getAttribute("aria-controls"));
      button.disabled = true;
      poll(button.getAttribute("data-url"), out, {
        every: 300,
        until: (el) => {
          const box = el.querySelector("[data-status]");
          return box !== null && box.getAttribute("data-status") !== "running";
        },
      });
    });
  }
});
