// A form's buttons are disabled while its request is in flight, so a second click does not
// send it again: a plain submit (until the next page; re-enabled when the browser shows this
// page again from its cache) and an htmx request (until its answer).
(function () {
  "use strict";
  function buttons(form) {
    return form ? form.querySelectorAll("button[type=submit], button:not([type])") : [];
  }
  document.addEventListener("submit", function (event) {
    const form = event.target;
    // htmx takes the submits it handles (preventDefault) and is covered below
    if (event.defaultPrevented) return;
    // after the submit has been taken: a disabled button would not be sent with the form
    window.setTimeout(function () {
      buttons(form).forEach(function (b) { b.disabled = true; b.setAttribute("aria-busy", "true"); });
    }, 0);
  });
  // The phone menu: one button shows and hides the navigation (and says which it is).
  document.addEventListener("click", function (event) {
    const button = event.target.closest ? event.target.closest(".menu-button") : null;
    if (!button) return;
    const header = button.closest("header");
    const open = header.classList.toggle("open");
    button.setAttribute("aria-expanded", open ? "true" : "false");
  });
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("button[aria-busy=true]").forEach(function (b) {
      b.disabled = false;
      b.removeAttribute("aria-busy");
    });
  });
  // htmx: only a request a submit started (a preview on change is not a submit), and only
  // the buttons this script disabled are enabled again (others have their own reasons).
  document.addEventListener("htmx:beforeRequest", function (event) {
    const elt = event.detail.elt;
    const cause = event.detail.requestConfig && event.detail.requestConfig.triggeringEvent;
    if (!elt || elt.tagName !== "FORM" || !cause || cause.type !== "submit") return;
    buttons(elt).forEach(function (b) {
      if (!b.disabled) { b.disabled = true; b.dataset.qmBusy = "1"; }
    });
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    const elt = event.detail.elt;
    if (!elt || elt.tagName !== "FORM") return;
    buttons(elt).forEach(function (b) {
      if (b.dataset.qmBusy) { b.disabled = false; delete b.dataset.qmBusy; }
    });
  });
})();
