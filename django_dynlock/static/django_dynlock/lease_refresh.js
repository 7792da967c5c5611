"use strict";
// The Leases list's auto-refresh (the "refresh" query parameter, off by default): every N
// seconds the same page is read again and its rows, footer, problem box and messages are
// swapped in, without reloading it. Each refresh is the page's one Scan, so none is sent while
// the tab is hidden; none while leases are ticked either, since a swap would clear the
// operator's selection.
(function () {
  const choice = document.getElementById("dynlock-refresh");
  if (choice) {
    // The period lives in the URL (bookmarks, links from elsewhere): choosing one reloads.
    choice.addEventListener("change", () => choice.form.submit());
  }
  const list = document.getElementById("changelist");
  const seconds = Number(list && list.dataset.refresh);
  if (!seconds) {
    return;
  }
  const status = document.getElementById("dynlock-refresh-status");
  let timer = null;
  let busy = false;

  function say(text) {
    if (status) {
      status.textContent = text || "";
    }
  }

  // The fresh page's element for selector in place of ours; ours goes when the fresh page has
  // none, unless kept (messages stay until the next page shows new ones, as on a reload).
  function swap(page, selector, before, keep) {
    const fresh = page.querySelector(selector);
    const old = document.querySelector(selector);
    if (fresh && old) {
      old.replaceWith(document.importNode(fresh, true));
    } else if (old && !keep) {
      old.remove();
    } else if (fresh && before) {
      before.parentNode.insertBefore(document.importNode(fresh, true), before);
    }
  }

  async function refresh() {
    if (document.querySelector("#changelist-form input.action-select:checked")) {
      say(status && status.dataset.paused);
      return;
    }
    let page;
    try {
      const reply = await fetch(window.location.href, { credentials: "same-origin" });
      // Redirected: to the login page, once the session has ended.
      if (!reply.ok || reply.redirected) {
        throw new Error(String(reply.status));
      }
      page = new DOMParser().parseFromString(await reply.text(), "text/html");
    } catch (error) {
      say(status && status.dataset.failed);
      return;
    }
    if (document.querySelector("#changelist-form input.action-select:checked")) {
      return; // ticked while the page was read: keep the selection
    }
    swap(page, "#result_list tbody");
    swap(page, "#changelist p.paginator");
    swap(page, "#content-main .dynlock-problem", list);
    swap(page, "ul.messagelist", document.getElementById("content"), true);
    say("");
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(tick, seconds * 1000);
  }

  async function tick() {
    if (busy || document.hidden) {
      return; // the visible tab schedules again when it shows
    }
    busy = true;
    try {
      await refresh();
    } finally {
      busy = false;
      schedule();
    }
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) {
      tick();
    }
  });
  schedule();
})();
