// The submit form's preview: Submit follows the verdict, and a form the browser
// refuses (htmx sends no preview then) never leaves an old "fits now" on show.
// "Fix the highlighted fields" highlights them: each one the browser or the preview finds
// wrong is marked (aria-invalid, the field's "invalid" class) with its message beside it.
(function () {
  "use strict";
  const form = document.getElementById("submit-form");
  if (!form) return;
  let poolChanged = false;
  // the server's own marks (a refused submit) stay until the first preview after a change
  let fresh = true;

  function follow() {
    const preview = document.getElementById("preview");
    const outcome = preview ? preview.dataset.outcome : "";
    const button = document.getElementById("submit-button");
    if (button) button.disabled = outcome === "rejected" || outcome === "invalid";
  }

  function clearMarks() {
    const f = document.getElementById("submit-form");
    f.querySelectorAll(".field .errorlist").forEach(function (e) { e.remove(); });
    f.querySelectorAll(".field.invalid").forEach(function (e) { e.classList.remove("invalid"); });
    f.querySelectorAll("[aria-invalid]").forEach(function (e) {
      e.removeAttribute("aria-invalid");
      const ids = (e.getAttribute("aria-describedby") || "").split(" ")
        .filter(function (id) { return id && id !== e.id + "_error"; });
      if (ids.length) e.setAttribute("aria-describedby", ids.join(" "));
      else e.removeAttribute("aria-describedby");
    });
  }

  function mark(input, message) {
    const field = input && input.closest(".field");
    if (!field || field.querySelector(".errorlist")) return;
    field.classList.add("invalid");
    input.setAttribute("aria-invalid", "true");
    const list = document.createElement("ul");
    list.className = "errorlist live";
    list.id = input.id + "_error";
    const item = document.createElement("li");
    item.textContent = message;
    list.appendChild(item);
    field.appendChild(list);
    const ids = (input.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
    ids.push(list.id);
    input.setAttribute("aria-describedby", ids.join(" "));
  }

  function focusFirst() {
    const first = document.querySelector("#submit-form [aria-invalid=true]");
    if (first) first.focus();
  }

  document.addEventListener("htmx:validation:halted", function (event) {
    if (!event.target || event.target.id !== "submit-form") return;
    const preview = document.getElementById("preview");
    if (preview) {
      preview.className = "card preview invalid";
      preview.dataset.outcome = "invalid";
      preview.innerHTML =
        '<h2>If you submit now</h2><p class="muted">Fix the highlighted fields to see a preview.</p>';
    }
    if (fresh) { follow(); return; }  // a blank form just shown: nothing to blame yet
    clearMarks();
    (event.detail.errors || []).forEach(function (e) { mark(e.elt, e.message); });
    // after a pool change the lost profile is what to fix next: go there
    if (poolChanged) focusFirst();
    poolChanged = false;
    follow();
  });
  // The pool's change fetches its profiles first (its own request); the preview follows on
  // qm-profiles. Not an hx-trigger filter: htmx evaluates those as code, which the CSP refuses.
  document.addEventListener("htmx:confirm", function (event) {
    const cause = event.detail.triggeringEvent;
    if (event.detail.elt && event.detail.elt.id === "submit-form" && cause &&
        cause.type === "change" && cause.target && cause.target.id === "id_pool") {
      event.preventDefault();
    }
  });
  ["change", "input"].forEach(function (type) {
    document.addEventListener(type, function (event) {
      if (event.target && event.target.closest && event.target.closest("#submit-form")) fresh = false;
    });
  });
  document.body.addEventListener("htmx:afterSwap", function (event) {
    const target = event.detail.target;
    if (target && target.id === "profile-field") poolChanged = true;
    if (target && target.id === "submit-form") fresh = true;
    if (target && target.id === "preview") {
      // the preview's verdict on every field: the ones it names are marked, the rest cleared
      const preview = document.getElementById("preview");
      if (!fresh) clearMarks();
      if (preview) {
        preview.querySelectorAll("[data-field]").forEach(function (p) {
          const input = document.getElementById("id_" + p.dataset.field);
          mark(input, p.textContent.replace(/^[^:]*:\s*/, ""));
        });
      }
      if (poolChanged) focusFirst();
      poolChanged = false;
    }
    follow();
  });
  follow();
})();
