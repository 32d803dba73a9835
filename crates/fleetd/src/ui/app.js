// fleetd's web view. Everything the fleet says reaches the page through textContent, never as
// markup: names, reasons and screens are untrusted text.
'use strict';

// The session's key, given once at sign-in: sent with every request (the cookie alone opens
// nothing), kept in this tab's storage, which no other origin (another port included) reads.
const KEY_HEADER = 'X-Fleet-Session-Key';
const KEY_STORE = 'fleetd-session-key';

// The states and statuses the page colours; anything else another host says is shown plain.
const KNOWN = new Set(['idle', 'up', 'busy', 'asking', 'blocked', 'spawning', 'stopping', 'gone', 'unknown', 'unreachable',
  'working', 'blocked', 'done', 'queued', 'injecting', 'injected', 'held', 'consumed', 'failed',
  'replied']);

// How many messages a page shows.
const PAGE = 50;

function paint(prefix, state) {
  return KNOWN.has(state) ? prefix + '-' + state : '';
}

const view = {
  me: null,
  after: null, // the seq of the last event had, to read on from after a reconnect
  trails: new Map(), // msg_id -> the states the feed showed it in, in order
  replied: new Set(), // msg_ids a reply answered
  failures: new Map(), // msg_id -> why it was not delivered, from the FAILED notice about it
  screen: null, // whose screen is open
  armed: null, // the stop button armed: {gid, until}
  entityRows: new Map(), // gid -> {row, actions, key}: each entity's row, kept across redraws
  following: false, // the feed is being read
  ticking: false, // the timers run
  refreshing: false,
  again: false,
  soon: null, // the timer of a redraw asked for by the feed
  filters: { with: '', state: '', kind: '' }, // what the message list keeps: '' is any
  pages: [], // the `before` of each page turned to, the one shown last; none: the newest
  next: null, // where the page after the one shown starts, if there are older messages
};

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

// fleetd's errors quote commands and names in `backticks`: shown as code, as text.
function problem(text) {
  const node = $('problem');
  node.replaceChildren();
  String(text || '').split('`').forEach((part, i) => {
    if (part) node.append(i % 2 ? el('code', part) : document.createTextNode(part));
  });
  node.hidden = !text;
}

function key() {
  return sessionStorage.getItem(KEY_STORE) || '';
}

async function api(path, body) {
  const options = { credentials: 'same-origin', headers: { [KEY_HEADER]: key() } };
  if (body !== undefined) {
    options.method = 'POST';
    options.headers['Content-Type'] = 'application/json';
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) {
    showSignIn();
    throw new Error(answer.message || 'signed out');
  }
  if (!response.ok) {
    const refused = new Error(answer.message || response.statusText);
    refused.status = response.status;
    throw refused;
  }
  return answer;
}

function ago(ms) {
  if (ms === null || ms === undefined) return '-';
  const s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
  if (s < 60) return s + 's ago';
  if (s < 3600) return Math.floor(s / 60) + 'm ago';
  if (s < 86400) return Math.floor(s / 3600) + 'h ago';
  return Math.floor(s / 86400) + 'd ago';
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false }) + '.' + String(ms % 1000).padStart(3, '0');
}

function statusCell(text, prefix) {
  return el('td', text === null || text === undefined ? '-' : text, paint(prefix, text));
}

function showSignIn() {
  $('fleet').hidden = true;
  $('signout').hidden = true;
  $('live').hidden = true;
  $('signin').hidden = false;
  $('token').focus();
}

function drawHosts(hosts) {
  const body = $('hosts').tBodies[0];
  body.replaceChildren(...hosts.map((h) => {
    const row = el('tr');
    row.dataset.host = h.host;
    row.append(
      el('td', h.host),
      statusCell(h.status, 'status'),
      el('td', h.last_seen_ms === null ? '(this one)' : ago(h.last_seen_ms)),
      el('td', (h.profiles || []).join(', ') || '-'),
    );
    return row;
  }));
}

// A stop takes two clicks: the first arms the button for five seconds, the second stops. The
// button is the same element across the table's redraws (see drawEntities), so it keeps its
// state, and a click that spans a redraw is not lost.
function stopButton(entity) {
  const button = el('button', 'Stop', 'stop');
  button.type = 'button';
  // Made anew while armed (its row's buttons changed): it shows so.
  showArmed(button, isArmed(entity.gid));
  button.addEventListener('click', async () => {
    if (!isArmed(entity.gid)) {
      // One armed at a time: another that was armed is not any more.
      for (const other of document.querySelectorAll('button.stop.armed')) showArmed(other, false);
      view.armed = { gid: entity.gid, until: Date.now() + 5000 };
      showArmed(button, true);
      setTimeout(() => {
        if (view.armed && view.armed.gid === entity.gid && !isArmed(entity.gid)) view.armed = null;
        if (!isArmed(entity.gid)) showArmed(button, false);
      }, 5000);
      return;
    }
    view.armed = null;
    button.disabled = true;
    button.textContent = 'Stopping…';
    try {
      await api('/api/v1/stop', { to: entity.gid });
      problem('');
    } catch (e) {
      problem('Could not stop ' + entity.name + ': ' + e.message);
      button.disabled = false;
      showArmed(button, false);
    }
    refresh();
  });
  return button;
}

// Whether the stop button of `gid` is armed now.
function isArmed(gid) {
  return Boolean(view.armed && view.armed.gid === gid && view.armed.until > Date.now());
}

function showArmed(button, armed) {
  button.classList.toggle('armed', armed);
  button.textContent = armed ? 'Confirm stop' : 'Stop';
}

function screenButton(entity) {
  const button = el('button', 'Screen', 'show-screen');
  button.type = 'button';
  button.addEventListener('click', () => openScreen(entity.name));
  return button;
}

// The cell of an entity's buttons, and what they act on: the same while that stays the same.
function actionsOf(entity) {
  // Only its owner reads a worker's screen or stops it (a lead it is shared with tasks it, no
  // more); a worker of another host is offered a stop when the lead spawned it there (its
  // `owner` says so: name@host). An operator stops this host's workers unless read-only, and
  // reads no screen.
  const here = entity.host === view.me.host;
  const own = entity.owner === (here ? view.me.name : view.me.name + '@' + view.me.host);
  const lead = view.me.role === 'lead';
  const screen = entity.role !== 'lead' && here && lead && own;
  const stop = entity.role !== 'lead' && view.me.may_stop && (lead ? own : here);
  const key = JSON.stringify([entity.name, screen, stop]);
  const kept = view.entityRows.get(entity.gid);
  if (kept && kept.key === key) return kept.actions;
  const actions = el('td');
  if (screen) actions.append(screenButton(entity), ' ');
  if (stop) actions.append(stopButton(entity));
  actions.dataset.key = key;
  return actions;
}

// What entity `e` was spawned as, "bwrap · backend": the sandbox runtime it runs in and the role
// its profile declares, '-' for what it has not (a lead has neither).
function spawnedAs(e) {
  if (!e.sandbox && !e.profile_role) return '-';
  return (e.sandbox || '-') + ' · ' + (e.profile_role || '-');
}

// Each entity keeps its row, and the row its cell of buttons, from one redraw to the next: only
// the cells of text are written again. A button replaced between a person's press and release
// would swallow the click.
function drawEntities(entities) {
  const body = $('entities').tBodies[0];
  const rows = new Map();
  for (const e of entities) {
    const kept = view.entityRows.get(e.gid);
    const actions = actionsOf(e);
    const row = kept ? kept.row : el('tr');
    row.dataset.name = e.name;
    row.dataset.status = e.status;
    for (const cell of [...row.cells]) if (cell !== actions) cell.remove();
    if (actions.parentNode !== row) row.append(actions);
    actions.before(
      el('td', e.name),
      el('td', e.host),
      el('td', e.slot ? e.role + ' (' + e.slot + ')' : e.role),
      el('td', e.profile || '-'),
      el('td', spawnedAs(e), 'spawned-as'),
      el('td', e.owner ? e.owner + (e.shared && e.shared.length ? ' (shared: ' + e.shared.join(', ') + ')' : '') : '-'),
      statusCell(e.status, 'status'),
      statusCell(e.agent_status, 'status'),
      el('td', e.held === null ? '-' : e.held, 'num'),
      el('td', e.queued === null ? '-' : e.queued, 'num'),
      el('td', ago(e.last_seen_ms)),
    );
    rows.set(e.gid, { row, actions, key: actions.dataset.key });
  }
  view.entityRows = rows;
  const order = [...rows.values()].map((r) => r.row);
  const shown = [...body.rows];
  if (order.length !== shown.length || order.some((row, i) => row !== shown[i])) body.replaceChildren(...order);
}

// The states message `m` went through: those the feed showed, then where it is now.
function trailOf(m) {
  const trail = (view.trails.get(m.msg_id) || []).slice();
  if (trail[trail.length - 1] !== m.state) trail.push(m.state);
  // How it was answered: as the API says (the same as `fleetd msgs`), else as the feed showed.
  const answer = m.answer || (view.replied.has(m.msg_id) ? 'replied' : view.failures.has(m.msg_id) ? 'failed' : null);
  if (answer && trail[trail.length - 1] !== answer) trail.push(answer);
  return trail;
}

// "2 queued · 1 failed": how the messages listed stand, failures first.
function tally(messages) {
  const counts = new Map();
  // A task typed and then answered only by a failure counts as failed, as `fleetd msgs --state failed` lists it.
  for (const m of messages) {
    const state = m.answer === 'failed' ? 'failed' : m.state;
    counts.set(state, (counts.get(state) || 0) + 1);
  }
  const order = ['failed', 'queued', 'injecting', 'held', 'injected', 'consumed'];
  const node = $('tally');
  node.replaceChildren();
  for (const state of order) {
    if (!counts.has(state)) continue;
    if (node.childNodes.length) node.append(' · ');
    node.append(el('span', counts.get(state) + ' ' + state, 'state-' + state));
  }
  if (node.childNodes.length && (view.next || view.pages.length)) node.append(' on this page');
}

// The filters chosen, as query parameters (`with=w1&state=failed`).
function filterParams() {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(view.filters)) if (value) params.set(name, value);
  return params;
}

// The query of the message list: its filters, and the page turned to.
function messagesQuery() {
  const query = filterParams();
  query.set('limit', String(PAGE));
  const before = view.pages[view.pages.length - 1];
  if (before) query.set('before', before);
  return query;
}

// The filters as the address keeps them (#with=w1&state=failed): a reload or a link keeps them.
function keepFilters() {
  const kept = filterParams().toString();
  history.replaceState(null, '', kept ? '#' + kept : location.pathname);
}

function readFilters() {
  const kept = new URLSearchParams(location.hash.replace(/^#/, ''));
  for (const name of Object.keys(view.filters)) {
    view.filters[name] = kept.get(name) || '';
    const select = $('filter-' + name);
    if (name !== 'with' && ![...select.options].some((o) => o.value === view.filters[name])) view.filters[name] = '';
    if (name === 'with') withOptions([]);
    else select.value = view.filters[name];
  }
}

// The entities to filter by: those of the roster, and the one chosen though it is gone.
function withOptions(entities) {
  const select = $('filter-with');
  const names = [...new Set(entities.map((e) => e.name))].sort();
  if (view.filters.with && !names.includes(view.filters.with)) names.push(view.filters.with);
  const shown = [...select.options].slice(1).map((o) => o.value);
  if (shown.length !== names.length || shown.some((n, i) => n !== names[i])) {
    select.replaceChildren(select.options[0], ...names.map((n) => { const o = el('option', n); o.value = n; return o; }));
  }
  select.value = view.filters.with;
}

// "51–100 of 812" (`newer`: how many come before this page), and which way the pages turn.
function drawPager(shown, total, newer) {
  const first = newer + 1;
  $('page-range').textContent = shown ? first + '–' + (first + shown - 1) + ' of ' + total : total ? 'none here of ' + total : 'none';
  $('page-older').disabled = !view.next;
  $('page-newer').disabled = view.pages.length === 0;
  $('page-newest').disabled = view.pages.length < 2;
}

// A page turned: the pager waits for that page before it turns again (a second click on Older
// before the page came would turn from the same place twice).
function turn(to) {
  if (to === 'older') {
    if (!view.next) return;
    view.pages.push(view.next);
  } else if (to === 'newer') view.pages.pop();
  else view.pages = [];
  view.next = null;
  for (const way of ['older', 'newer', 'newest']) $('page-' + way).disabled = true;
  refresh();
}

function filtered(name, value) {
  view.filters[name] = value;
  view.pages = [];
  view.next = null;
  keepFilters();
  refresh();
}

function drawMessages(page) {
  const messages = page.messages;
  view.next = page.next || null;
  drawPager(messages.length, page.total, page.newer || 0);
  tally(messages);
  for (const m of messages) {
    if (m.kind === 'REPLY' && m.in_reply_to) view.replied.add(m.in_reply_to);
    if (m.kind === 'FAILED' && m.in_reply_to) view.failures.set(m.in_reply_to, m.reason || '');
  }
  const body = $('messages').tBodies[0];
  body.replaceChildren(...messages.map((m) => {
    const failed = m.state === 'failed' || m.answer === 'failed' || m.kind === 'FAILED' || view.failures.has(m.msg_id);
    const row = el('tr', null, failed ? 'failed' : '');
    row.dataset.msgId = m.msg_id;
    row.dataset.kind = m.kind;
    row.dataset.from = m.from_name;
    row.dataset.to = m.to_name;
    const trail = el('td', null, 'trail');
    for (const state of trailOf(m)) trail.append(el('span', state, paint('state', state)));
    row.append(
      el('td', clock(m.created_ms)),
      el('td', m.kind),
      el('td', m.from_name),
      el('td', m.to_name),
      trail,
      el('td', m.reason || view.failures.get(m.msg_id) || ''),
    );
    return row;
  }));
  if (!messages.length) {
    const none = el('td', view.filters.with || view.filters.state || view.filters.kind ? 'No message matches these filters.' : 'No messages yet.');
    none.colSpan = 6;
    const row = el('tr', null, 'none');
    row.append(none);
    body.append(row);
  }
}

async function refresh() {
  if (view.refreshing) { view.again = true; return; }
  view.refreshing = true;
  try {
    const query = messagesQuery().toString();
    const [roster, listed] = await Promise.all([
      api('/api/v1/roster'),
      api('/api/v1/messages?' + query).catch((e) => {
        // The message the page starts after is no longer kept: back to the newest.
        if (!view.pages.length || e.status !== 400 || !e.message.startsWith('before=')) throw e;
        view.pages = [];
        view.again = true;
        return null;
      }),
    ]);
    drawHosts(roster.hosts);
    drawEntities(roster.entities);
    withOptions(roster.entities);
    // Drawn only if it is still the page asked for (a page turned or a filter changed since
    // is fetched by the refresh that follows).
    if (listed && query === messagesQuery().toString()) drawMessages(listed);
    else view.again = true;
  } catch (e) {
    problem(e.message);
  } finally {
    view.refreshing = false;
    if (view.again) { view.again = false; refresh(); }
  }
}

function feedLine(ev) {
  if (ev.subject === 'message') {
    let text = clock(ev.at_ms) + ' message ' + ev.kind + ' ' + ev.from_name + ' → ' + ev.to_name + ' ' + ev.state;
    if (ev.reason) text += ': ' + ev.reason;
    return el('li', text, ev.state === 'failed' || ev.kind === 'FAILED' ? 'failed' : '');
  }
  return el('li', clock(ev.at_ms) + ' ' + ev.role + ' ' + ev.name + ' ' + ev.status, ev.status === 'gone' ? 'failed' : '');
}

function onEvent(ev) {
  if (ev.subject === 'message') {
    const trail = view.trails.get(ev.msg_id) || [];
    if (trail[trail.length - 1] !== ev.state) trail.push(ev.state);
    view.trails.set(ev.msg_id, trail);
    if (ev.kind === 'REPLY' && ev.in_reply_to) view.replied.add(ev.in_reply_to);
  }
  const feed = $('feed');
  feed.prepend(feedLine(ev));
  while (feed.children.length > 200) feed.lastChild.remove();
  soon();
}

// A busy fleet's feed brings many events a second: the tables are read again once for all
// that came within a quarter of a second, not once each.
function soon() {
  if (view.soon) return;
  view.soon = setTimeout(() => { view.soon = null; refresh(); }, 250);
}

// One block of the event stream: its id (the seq to read on after) and its data.
function onBlock(block) {
  const data = [];
  let name = 'message';
  for (const line of block.split(/\r\n|\r|\n/)) {
    if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    else if (line.startsWith('id:')) view.after = line.slice(3).trim();
    else if (line.startsWith('event:')) name = line.slice(6).trim();
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join('\n'));
  if (name === 'error') problem(payload.message);
  else onEvent(payload);
}

// The live feed, read with fetch (an EventSource cannot send the session's key); after a drop,
// read on from the last event had.
async function follow() {
  const live = $('live');
  live.hidden = false;
  view.following = true;
  for (;;) {
    try {
      const after = view.after === null ? '' : '?after=' + encodeURIComponent(view.after);
      const response = await fetch('/api/v1/events' + after, {
        credentials: 'same-origin',
        headers: { [KEY_HEADER]: key() },
      });
      if (response.status === 401) {
        view.following = false;
        showSignIn();
        return;
      }
      if (!response.ok) throw new Error(response.statusText);
      live.dataset.live = 'true';
      live.textContent = 'live';
      refresh();
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
          onBlock(block);
        }
      }
    } catch (e) {
      problem('the live feed dropped: ' + e.message);
    }
    live.dataset.live = 'false';
    live.textContent = 'reconnecting…';
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

async function showScreen() {
  if (!view.screen) return;
  try {
    const screen = await api('/api/v1/screen?name=' + encodeURIComponent(view.screen));
    $('screen-text').textContent = screen.text.replace(/\s+$/, '');
  } catch (e) {
    $('screen-text').textContent = '(' + e.message + ')';
  }
}

// The screen opens under the workers, above the messages, and is brought into view: however
// many messages there are, it is where the eye is when its button is pressed.
function openScreen(name) {
  view.screen = name;
  $('screen-name').textContent = name;
  $('screen').hidden = false;
  $('screen').scrollIntoView({block: 'nearest'});
  showScreen();
}

async function signIn(event) {
  event.preventDefault();
  const response = await fetch('/ui/session', {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ token: $('token').value }),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    $('signin-error').textContent = answer.message || response.statusText;
    $('signin-error').hidden = false;
    $('token').value = '';
    $('token').focus();
    return;
  }
  sessionStorage.setItem(KEY_STORE, answer.key);
  $('token').value = '';
  $('signin-error').hidden = true;
  enter();
}

async function start() {
  $('signin-form').addEventListener('submit', signIn);
  $('screen-close').addEventListener('click', () => { view.screen = null; $('screen').hidden = true; });
  for (const name of Object.keys(view.filters)) {
    $('filter-' + name).addEventListener('change', (event) => filtered(name, event.target.value));
  }
  for (const to of ['older', 'newer', 'newest']) $('page-' + to).addEventListener('click', () => turn(to));
  $('filters').addEventListener('submit', (event) => event.preventDefault());
  $('signout').addEventListener('click', async () => {
    try { await api('/ui/signout', {}); } catch (e) { problem(e.message); }
    sessionStorage.removeItem(KEY_STORE);
    location.replace('/ui');
  });
  if (!key()) { showSignIn(); return; }
  enter();
}

async function enter() {
  try {
    view.me = await api('/ui/me');
  } catch (e) {
    return;
  }
  const operator = view.me.role === 'operator' ? ' (operator' + (view.me.may_stop ? '' : ', read-only') + ')' : '';
  $('who').textContent = view.me.name + operator + ' @ ' + view.me.host;
  $('signin').hidden = true;
  $('fleet').hidden = false;
  $('signout').hidden = false;
  // Signed in again (as someone else, maybe): nothing of before stays on the page.
  view.trails.clear();
  view.replied.clear();
  view.failures.clear();
  view.screen = null;
  view.armed = null;
  view.entityRows = new Map();
  view.pages = [];
  readFilters();
  $('screen').hidden = true;
  $('feed').replaceChildren();
  problem('');
  await refresh();
  if (!view.following) follow();
  if (!view.ticking) {
    view.ticking = true;
    // Other hosts come and go through presence, not this gateway's feed: look again now and
    // then.
    setInterval(refresh, 5000);
    setInterval(showScreen, 1000);
  }
}

document.addEventListener('DOMContentLoaded', start);
