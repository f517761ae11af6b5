// The submit form's preview: Submit follows the verdict, and a form the browser
// refuses (htmx sends no preview then) never leaves an old "fits now" on show.
(function () {
  "use strict";
  const form = document.getElementById("submit-form");
  if (!form) return;
  const button = document.getElementById("submit-button");

  function follow() {
    const preview = document.getElementById("preview");
    const outcome = preview ? preview.dataset.outcome : "";
    if (button) button.disabled = outcome === "rejected" || outcome === "invalid";
  }

  form.addEventListener("htmx:validation:halted", function () {
    const preview = document.getElementById("preview");
    if (preview) {
      preview.className = "card preview invalid";
      preview.dataset.outcome = "invalid";
      preview.innerHTML =
        '<h2>If you submit now</h2><p class="muted">Fix the highlighted fields to see a preview.</p>';
    }
    follow();
  });
  // The pool's change fetches its profiles first (its own request); the preview follows on
  // qm-profiles. Not an hx-trigger filter: htmx evaluates those as code, which the CSP refuses.
  form.addEventListener("htmx:confirm", function (event) {
    const cause = event.detail.triggeringEvent;
    if (event.detail.elt === form && cause && cause.type === "change" &&
        cause.target && cause.target.id === "id_pool") {
      event.preventDefault();
    }
  });
  document.body.addEventListener("htmx:afterSwap", follow);
  follow();
})();
