// The console's one script: it only adds to pages that work without it. Served from the
// binary under a content-hashed name; the pages' Content-Security-Policy allows no other.
"use strict";
// Forms that change something ask first.
document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
// Pages marked data-refresh reload their <main> every few seconds while the tab is visible.
(function () {
  var seconds = Number(document.body.getAttribute("data-refresh") || 0);
  if (!seconds) {
    return;
  }
  function refresh() {
    if (document.visibilityState !== "visible") {
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "x-console-refresh": "1" } })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (html) {
        if (!html) {
          return;
        }
        var next = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        var main = document.querySelector("main");
        if (next && main) {
          main.replaceWith(next);
        }
      })
      .catch(function () {});
  }
  window.setInterval(refresh, seconds * 1000);
})();
