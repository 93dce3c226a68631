// groupcoord console: live updates of a page's fragments (server-sent events).
// The server re-renders each live fragment and sends it only when it changed;
// this swaps it in and keeps the keyboard focus where it was.
"use strict";
// A form that changes something asks first (data-confirm: a member's Drain button).
// Listened to on the document: live updates replace the forms themselves.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form && form.getAttribute ? form.getAttribute("data-confirm") : null;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
(function () {
  var url = document.body.getAttribute("data-live-url");
  var status = document.getElementById("live-status");
  if (!url) {
    return;
  }

  function say(text, state) {
    if (status) {
      status.textContent = text;
      status.setAttribute("data-state", state);
    }
  }

  if (!window.EventSource) {
    say("Live updates are not available in this browser: reload to refresh.", "off");
    return;
  }

  // What identifies a focusable element across re-renders.
  function keyOf(el) {
    return el.getAttribute("data-key") || el.getAttribute("href") || el.id || null;
  }

  function refocus(root, key) {
    var candidates = root.querySelectorAll("a[href], button, input, select, [tabindex], [data-key]");
    for (var i = 0; i < candidates.length; i++) {
      if (keyOf(candidates[i]) === key) {
        candidates[i].focus();
        return;
      }
    }
  }

  // The key of a focused element a swap took away (e.g. the grid while a group
  // rebalances and has nothing assigned): focused again when a later swap
  // brings it back, unless the user has put the focus elsewhere meanwhile.
  var lostKey = null;
  document.addEventListener("focusin", function () {
    lostKey = null;
  });

  function nothingFocused() {
    var active = document.activeElement;
    return !active || active === document.body;
  }

  function swap(message) {
    var el = document.getElementById(message.id);
    if (!el || !el.hasAttribute("data-live") || el.getAttribute("data-digest") === message.digest) {
      return;
    }
    var active = document.activeElement;
    var key = active && active !== document.body && el.contains(active) ? keyOf(active)
      : (nothingFocused() ? lostKey : null);
    // The HTML is the server's own rendering of this fragment (autoescaped templates).
    el.innerHTML = message.html;
    el.setAttribute("data-digest", message.digest);
    if (key) {
      refocus(el, key);
      if (nothingFocused()) {
        lostKey = key;
      }
    }
  }

  var source = new EventSource(url);
  source.addEventListener("open", function () {
    say("Live: this page updates as the coordinator changes.", "on");
  });
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED) {
      say("Live updates are off (the server refused or stopped): reload the page to retry.", "off");
    } else {
      say("Live updates interrupted: reconnecting…", "wait");
    }
  });
  source.addEventListener("fragment", function (event) {
    swap(JSON.parse(event.data));
  });
  source.addEventListener("end", function (event) {
    source.close();
    say(JSON.parse(event.data).message + " Reload the page to resume live updates.", "off");
  });
  window.addEventListener("pagehide", function () {
    source.close();
  });
})();
