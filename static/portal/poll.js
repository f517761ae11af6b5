// Polling regions pause while someone works in them: an element with data-poll-pause skips
// its request while it holds a match for that selector (an open <details>, a ticked box).
// Here and not in an hx-trigger filter: htmx evaluates filters as code, which the CSP refuses.
(function () {
  "use strict";
  document.addEventListener("htmx:confirm", function (event) {
    const elt = event.detail.elt;
    const pause = elt && elt.dataset ? elt.dataset.pollPause : "";
    if (pause && elt.querySelector(pause)) event.preventDefault();
  });
})();
