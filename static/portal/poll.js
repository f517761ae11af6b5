// Polling regions (hx-trigger "every …") refresh only when someone can use the refresh:
// - an element with data-poll-pause skips its request while it holds a match for that selector
//   (an open <details>, a ticked box);
// - nothing polls while a menu or a dialog is open (rows must not move under the pointer), or
//   while the tab is hidden; coming back refreshes at once;
// - a refresh that fails shows a banner ("Could not refresh at HH:MM; retrying") until one
//   succeeds.
// Here and not in an hx-trigger filter: htmx evaluates filters as code, which the CSP refuses.
(function () {
  "use strict";
  function polls(elt) {
    return !!(elt && elt.getAttribute && /\bevery\b/.test(elt.getAttribute("hx-trigger") || ""));
  }
  document.addEventListener("htmx:confirm", function (event) {
    const elt = event.detail.elt;
    const pause = elt && elt.dataset ? elt.dataset.pollPause : "";
    if (pause && elt.querySelector(pause)) { event.preventDefault(); return; }
    if (!polls(elt)) return;
    if (document.hidden || document.querySelector("details.menu[open], dialog[open]")) {
      event.preventDefault();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden || !window.htmx) return;
    document.querySelectorAll("[hx-trigger*=every][hx-get]").forEach(function (elt) {
      window.htmx.ajax("GET", elt.getAttribute("hx-get"), { source: elt });
    });
  });

  function banner() {
    let b = document.getElementById("qm-stale");
    if (!b) {
      b = document.createElement("p");
      b.id = "qm-stale";
      b.className = "stale";
      b.setAttribute("role", "status");
      b.dataset.testid = "stale";
      const main = document.getElementById("content") || document.body;
      main.insertBefore(b, main.firstChild);
    }
    return b;
  }
  function failed(event) {
    if (!polls(event.detail.elt)) return;
    const now = new Date();
    const hhmm = String(now.getHours()).padStart(2, "0") + ":" + String(now.getMinutes()).padStart(2, "0");
    banner().textContent = "Could not refresh at " + hhmm + "; retrying.";
  }
  document.addEventListener("htmx:responseError", failed);
  document.addEventListener("htmx:sendError", failed);
  // before the swap: the polled element is still in the page (an outerHTML swap replaces it)
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (!polls(event.detail.elt) || event.detail.xhr.status >= 400) return;
    const b = document.getElementById("qm-stale");
    if (b) b.remove();
  });
})();
