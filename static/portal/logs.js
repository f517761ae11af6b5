// Keep a followed log scrolled to its newest line, unless the reader scrolled up to read.
(function () {
  "use strict";
  let pinned = true;
  function scroll() {
    const log = document.querySelector("pre.log");
    if (!log) return;
    if (pinned) log.scrollTop = log.scrollHeight;
    log.addEventListener("scroll", function () {
      pinned = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    });
  }
  document.addEventListener("DOMContentLoaded", scroll);
  document.body.addEventListener("htmx:afterSettle", scroll);
})();
