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
  // A submit button that posts its form with htmx (hx-post on the button) counts as well.
  function submitting(elt, cause) {
    if (!elt || !cause) return null;
    if (elt.tagName === "FORM" && cause.type === "submit") return elt;
    if (elt.tagName === "BUTTON" && cause.type === "click" && elt.form) return elt.form;
    return null;
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    const cause = event.detail.requestConfig && event.detail.requestConfig.triggeringEvent;
    const form = submitting(event.detail.elt, cause);
    if (!form) return;
    buttons(form).forEach(function (b) {
      if (!b.disabled) { b.disabled = true; b.dataset.qmBusy = "1"; }
    });
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    const elt = event.detail.elt;
    const form = elt && (elt.tagName === "FORM" ? elt : elt.form);
    if (!form) return;
    buttons(form).forEach(function (b) {
      if (b.dataset.qmBusy) { b.disabled = false; delete b.dataset.qmBusy; }
    });
  });
  // Errors next to the field, where the reader is: a form marked data-errors-in-place is
  // posted by htmx and its 400 answer (the form with its errors) swapped in where it stands,
  // instead of a page load that starts again at the top.
  document.addEventListener("htmx:beforeSwap", function (event) {
    const elt = event.detail.elt;
    const form = elt && (elt.tagName === "FORM" ? elt : elt.form);
    if (event.detail.xhr.status === 400 && form && form.hasAttribute("data-errors-in-place")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
  // The first field to fix gets the focus: on a page shown with errors, and when a form
  // comes back with them.
  function focusInvalid(root) {
    const first = root.querySelector("form [aria-invalid=true], form[aria-invalid=true]") ||
      (root.tagName === "FORM" ? root.querySelector("[aria-invalid=true]") : null);
    if (first) first.focus({ preventScroll: false });
  }
  document.addEventListener("DOMContentLoaded", function () {
    const main = document.getElementById("content");
    if (main) focusInvalid(main);
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    const target = event.detail.elt;
    if (target && target.tagName === "FORM" && target.hasAttribute("data-errors-in-place")) {
      focusInvalid(target);
    }
  });
  // Menus (details.menu): one open at a time, closed by a click elsewhere or Escape.
  document.addEventListener("click", function (event) {
    document.querySelectorAll("details.menu[open]").forEach(function (d) {
      if (!d.contains(event.target)) d.removeAttribute("open");
    });
  });
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") return;
    document.querySelectorAll("details.menu[open]").forEach(function (d) {
      d.removeAttribute("open");
      const s = d.querySelector("summary");
      if (s) s.focus();
    });
  });
})();
