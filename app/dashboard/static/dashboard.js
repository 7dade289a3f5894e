// Live pages only: reload every few seconds unless the reader is typing in a form.
(function () {
  "use strict";
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!seconds) { return; }
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  setInterval(function () {
    var el = document.activeElement;
    var typing = el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
    if (!typing && !touched && document.visibilityState === "visible") {
      window.location.reload();
    }
  }, seconds * 1000);
})();
