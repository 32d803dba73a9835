//! A big fleet over several private tmux servers. A tmux server walks every pane it holds on
//! each turn of its loop, so the cost of a keystroke or a look grows with the panes beside it;
//! past `per_server` panes, new panes go to another server of the gateway's own, so no server
//! holds them all.
//!
//! The servers are `NAME` (server 1) and `NAME@2`, `NAME@3` … (`@` is in no name fleetd takes, so
//! no other gateway's server is named so). A pane of server 1 keeps tmux's
//! own id (`%7`); a pane of server K > 1 is `K:%7`. [`Load`] (pure) decides where a new pane
//! goes; [`Spread`] is the [`PaneHost`] over the servers, each a [`Tmux::private`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};

use async_trait::async_trait;
use fleet_core::dialog::Key;

use super::{Socket, Tmux};
use crate::{AgentState, MuxError, OutputWatch, PaneHost, PaneId, PaneSpec, PaneState, Snapshot};

/// The most servers a gateway opens; past them, new panes go to the least loaded.
pub const MAX_SERVERS: usize = 256;

/// Where the panes are: per server, the panes it holds and the spawns under way on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Per server (index 0 is server 1): its panes (tmux's ids), alive or exited, each with
    /// the count of changes when it was made (0: it was listed).
    held: Vec<HashMap<PaneId, u64>>,
    /// Per server: the panes closed since its last listing began, with the count of changes
    /// when they were (a listing under way may still show them).
    gone: Vec<HashMap<PaneId, u64>>,
    /// Per server: spawns under way.
    pending: Vec<usize>,
    /// Panes made and closed so far.
    changes: u64,
}

impl Load {
    /// Servers known.
    pub fn servers(&self) -> usize {
        self.held.len()
    }

    /// Knows of `n` servers (those found running at start), holding nothing yet.
    pub fn with_servers(n: usize) -> Self {
        let mut load = Self::default();
        if let Some(last) = n.checked_sub(1) {
            load.open(last);
        }
        load
    }

    /// Knows of server `index` (and those before it).
    pub fn open(&mut self, index: usize) {
        let n = (index + 1).max(self.servers());
        self.held.resize_with(n, HashMap::new);
        self.gone.resize_with(n, HashMap::new);
        self.pending.resize(n, 0);
    }

    fn load(&self, server: usize) -> usize {
        self.held[server].len() + self.pending[server]
    }

    /// The server (index) a new pane goes to, counted as a spawn under way there: the first
    /// holding fewer than `per_server`, else a new one, else (at [`MAX_SERVERS`]) the least
    /// loaded.
    pub fn place(&mut self, per_server: usize) -> usize {
        let k = match (0..self.servers()).find(|&k| self.load(k) < per_server.max(1)) {
            Some(k) => k,
            None if self.servers() < MAX_SERVERS => {
                self.open(self.servers());
                self.servers() - 1
            }
            None => (0..self.servers())
                .min_by_key(|&k| self.load(k))
                .unwrap_or(0),
        };
        self.pending[k] += 1;
        k
    }

    /// The spawn placed on `server` ended, and made `pane` if it is given.
    pub fn spawned(&mut self, server: usize, pane: Option<&PaneId>) {
        if let Some(pending) = self.pending.get_mut(server) {
            *pending = pending.saturating_sub(1);
        }
        if let (Some(held), Some(pane)) = (self.held.get_mut(server), pane) {
            self.changes += 1;
            held.insert(pane.clone(), self.changes);
        }
    }

    /// `pane` of `server` was closed.
    pub fn closed(&mut self, server: usize, pane: &PaneId) {
        if let (Some(held), Some(gone)) = (self.held.get_mut(server), self.gone.get_mut(server)) {
            self.changes += 1;
            held.remove(pane);
            gone.insert(pane.clone(), self.changes);
        }
    }

    /// A mark to take before listing a server: [`Load::listed`] keeps the panes made after
    /// it, which the listing may have missed, and leaves out those closed after it, which
    /// the listing may still show.
    pub fn mark(&self) -> u64 {
        self.changes
    }

    /// `server`, listed after `mark`, holds `panes` (and whatever was made since the mark, but
    /// not what was closed since).
    pub fn listed<'a>(
        &mut self,
        server: usize,
        panes: impl Iterator<Item = &'a PaneId>,
        mark: u64,
    ) {
        let (Some(held), Some(gone)) = (self.held.get_mut(server), self.gone.get_mut(server))
        else {
            return;
        };
        held.retain(|_, made| *made > mark);
        gone.retain(|_, closed| *closed > mark);
        for pane in panes.filter(|pane| !gone.contains_key(*pane)) {
            held.entry(pane.clone()).or_insert(0);
        }
    }
}

/// The socket name of server `index` (0 is server 1) of the servers named `name`.
pub fn server_name(name: &str, index: usize) -> String {
    match index {
        0 => name.to_string(),
        k => format!("{name}@{}", k + 1),
    }
}

/// The id the fleet knows `pane` of server `index` by.
pub fn outer_id(index: usize, pane: &PaneId) -> PaneId {
    match index {
        0 => pane.clone(),
        k => PaneId(format!("{}:{pane}", k + 1)),
    }
}

/// The index of server `number` (`2` for `NAME@2` and `2:%7`); None unless it is written as
/// such a number is, once (no sign, no leading zero), and in 2..=[`MAX_SERVERS`].
fn server_index(number: &str) -> Option<usize> {
    let digits = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    if !digits || number.starts_with('0') {
        return None;
    }
    let number: usize = number.parse().ok()?;
    (2..=MAX_SERVERS).contains(&number).then(|| number - 1)
}

/// The server (index) and tmux's own id of a pane the fleet knows as `pane`; None for an id
/// no server of a spread gave (each pane has one id only: no leading zero, no server 1).
pub fn inner_id(pane: &PaneId) -> Option<(usize, PaneId)> {
    let (index, id) = match pane.0.split_once(':') {
        None => (0, pane.0.as_str()),
        Some((server, id)) => (server_index(server)?, id),
    };
    let number = id.strip_prefix('%')?;
    (!number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (index, PaneId(id.to_string())))
}

/// The numbers of the servers a previous run of `name` may have left (`name@K` for K in
/// 2..=[`MAX_SERVERS`]), from the socket files in tmux's socket dir (`$TMUX_TMPDIR` or `/tmp`,
/// then `tmux-UID`, as tmux places them); in order, each once.
fn socket_files(name: &str) -> Vec<usize> {
    let base = std::env::var_os("TMUX_TMPDIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let dir = base.join(format!("tmux-{}", rustix::process::getuid().as_raw()));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let prefix = format!("{name}@");
    let mut found: Vec<usize> = entries
        .flatten()
        .filter_map(|entry| server_index(entry.file_name().to_str()?.strip_prefix(&prefix)?))
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// The servers of a spread, by index: `None` for one not opened (not running, as far as is
/// known), so looking at the panes never starts it.
type Servers = Vec<Option<Arc<Tmux>>>;

/// The fleet's panes over one or more private tmux servers.
#[derive(Debug)]
pub struct Spread {
    /// Server 1's socket name; the others' derive from it.
    name: String,
    /// Where pastes are staged (shared by the servers: each paste has a file of its own).
    scratch: PathBuf,
    /// Panes a server holds before new ones go to another.
    per_server: usize,
    /// The servers opened, by index, and where the panes are.
    state: std::sync::Mutex<(Servers, Load)>,
}

impl Spread {
    /// The servers named after `name`: server 1, and those a previous run left running (each
    /// with fleetd's control session: a server of that name without it is somebody else's).
    /// New panes go to another server once one holds `per_server`.
    pub async fn open(name: String, scratch: PathBuf, per_server: usize) -> Self {
        let mut servers: Servers =
            vec![Some(Arc::new(Tmux::private(name.clone(), scratch.clone())))];
        for index in socket_files(&name) {
            if let Some(server) = Self::reach(&name, &scratch, index).await {
                servers.resize(index + 1, None);
                servers[index] = Some(server);
            }
        }
        let load = Load::with_servers(servers.len());
        Self {
            name,
            scratch,
            per_server: per_server.max(1),
            state: std::sync::Mutex::new((servers, load)),
        }
    }

    /// Server `index` of `name`, if it runs with fleetd's control session (asked with a tmux
    /// client, which starts no server).
    async fn reach(name: &str, scratch: &Path, index: usize) -> Option<Arc<Tmux>> {
        let server_name = server_name(name, index);
        Tmux::new(Socket::Name(server_name.clone()))
            .holds_control_session()
            .await
            .then(|| Arc::new(Tmux::private(server_name, scratch.to_path_buf())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Servers, Load)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The servers opened so far, with their indexes.
    fn servers(&self) -> Vec<(usize, Arc<Tmux>)> {
        self.lock()
            .0
            .iter()
            .enumerate()
            .filter_map(|(index, server)| Some((index, Arc::clone(server.as_ref()?))))
            .collect()
    }

    /// The server holding `pane`, and tmux's own id of it. A server not opened that a pane id
    /// names (found running since) is opened.
    async fn locate(&self, pane: &PaneId) -> Result<(usize, Arc<Tmux>, PaneId), MuxError> {
        let gone = || MuxError::NoPane(pane.clone());
        let (index, inner) = inner_id(pane).ok_or_else(gone)?;
        if let Some(Some(server)) = self.lock().0.get(index) {
            return Ok((index, Arc::clone(server), inner));
        }
        let server = Self::reach(&self.name, &self.scratch, index)
            .await
            .ok_or_else(gone)?;
        let mut state = self.lock();
        let (servers, load) = &mut *state;
        if servers.len() <= index {
            servers.resize(index + 1, None);
        }
        load.open(index);
        let server = Arc::clone(servers[index].get_or_insert(server));
        Ok((index, server, inner))
    }

    /// The command a user runs to look at the fleet's panes.
    pub fn attach_hint(&self) -> String {
        format!(
            "tmux -L {} attach (past {} panes, also {}, {} …)",
            self.name,
            self.per_server,
            server_name(&self.name, 1),
            server_name(&self.name, 2)
        )
    }

    /// Stops every server and the panes in them.
    pub async fn kill_servers(&self) -> Result<(), MuxError> {
        let mut first_error = None;
        for (_, server) in self.servers() {
            if let Err(e) = server.kill_server().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// `result` with a gone pane named as the fleet knows it.
fn renamed<T>(result: Result<T, MuxError>, pane: &PaneId) -> Result<T, MuxError> {
    result.map_err(|e| match e {
        MuxError::NoPane(_) => MuxError::NoPane(pane.clone()),
        e => e,
    })
}

#[async_trait]
impl PaneHost for Spread {
    async fn spawn(&self, spec: &PaneSpec) -> Result<PaneId, MuxError> {
        let (index, server) = {
            let mut state = self.lock();
            let (servers, load) = &mut *state;
            let index = load.place(self.per_server);
            if servers.len() <= index {
                servers.resize(index + 1, None);
            }
            let server = servers[index].get_or_insert_with(|| {
                Arc::new(Tmux::private(
                    server_name(&self.name, index),
                    self.scratch.clone(),
                ))
            });
            (index, Arc::clone(server))
        };
        let made = server.spawn(spec).await;
        self.lock().1.spawned(index, made.as_ref().ok());
        made.map(|pane| outer_id(index, &pane))
    }

    async fn leave_mode(&self, pane: &PaneId) -> Result<(), MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.leave_mode(&inner).await, pane)
    }

    async fn paste(&self, pane: &PaneId, text: &str) -> Result<(), MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.paste(&inner, text).await, pane)
    }

    async fn enter(&self, pane: &PaneId) -> Result<(), MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.enter(&inner).await, pane)
    }

    async fn press(&self, pane: &PaneId, key: Key) -> Result<(), MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.press(&inner, key).await, pane)
    }

    async fn snapshot(&self, pane: &PaneId) -> Result<Snapshot, MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.snapshot(&inner).await, pane)
    }

    async fn styled(&self, pane: &PaneId) -> Result<String, MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.styled(&inner).await, pane)
    }

    async fn history(&self, pane: &PaneId, lines: usize) -> Result<String, MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.history(&inner, lines).await, pane)
    }

    async fn panes(&self) -> Result<BTreeMap<PaneId, PaneState>, MuxError> {
        let mut all = BTreeMap::new();
        // One server that cannot be listed fails the whole listing: taken as a listing of
        // the others alone, it would end the workers on that one.
        for (index, server) in self.servers() {
            let mark = self.lock().1.mark();
            let panes = server.panes().await?;
            self.lock().1.listed(index, panes.keys(), mark);
            all.extend(
                panes
                    .into_iter()
                    .map(|(pane, state)| (outer_id(index, &pane), state)),
            );
        }
        Ok(all)
    }

    async fn report(&self, _pane: &PaneId, _state: AgentState) -> Result<(), MuxError> {
        Ok(())
    }

    async fn pid(&self, pane: &PaneId) -> Result<u32, MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.pid(&inner).await, pane)
    }

    async fn close(&self, pane: &PaneId) -> Result<(), MuxError> {
        let (index, server, inner) = match self.locate(pane).await {
            Ok(found) => found,
            // No server of ours holds it: it is closed.
            Err(MuxError::NoPane(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        server.close(&inner).await?;
        self.lock().1.closed(index, &inner);
        Ok(())
    }

    async fn watch_output(&self, pane: &PaneId) -> Result<OutputWatch, MuxError> {
        let (_, server, inner) = self.locate(pane).await?;
        renamed(server.watch_output(&inner).await, pane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pane(n: u32) -> PaneId {
        PaneId(format!("%{n}"))
    }

    /// Places and makes a pane numbered `n`, `per_server` to a server; returns its server.
    fn make(load: &mut Load, n: u32, per_server: usize) -> usize {
        let k = load.place(per_server);
        load.spawned(k, Some(&pane(n)));
        k
    }

    #[test]
    fn new_panes_fill_a_server_before_the_next_opens() {
        let mut load = Load::with_servers(1);
        let placed: Vec<usize> = (0..5).map(|n| make(&mut load, n, 2)).collect();
        assert_eq!(placed, [0, 0, 1, 1, 2]);
        assert_eq!(load.servers(), 3);
    }

    #[test]
    fn a_failed_spawn_frees_its_place_and_a_made_one_keeps_it() {
        let mut load = Load::with_servers(1);
        let first = load.place(1);
        load.spawned(first, None);
        assert_eq!(load.place(1), 0, "the failed spawn held nothing");
        load.spawned(0, Some(&pane(1)));
        assert_eq!(load.place(1), 1, "the made pane holds server 1");
    }

    #[test]
    fn closed_and_listed_panes_free_room_on_their_server() {
        let mut load = Load::with_servers(1);
        for n in 0..4 {
            make(&mut load, n, 2);
        }
        load.closed(0, &pane(0));
        assert_eq!(
            make(&mut load, 4, 2),
            0,
            "a closed pane made room on server 1"
        );
        let mark = load.mark();
        load.listed(1, [].iter(), mark);
        assert_eq!(load.place(2), 1, "server 2 was listed empty");
        // A server nobody opened is not made up by a stray count.
        load.listed(9, [pane(1)].iter(), mark);
        load.closed(9, &pane(1));
        load.spawned(9, Some(&pane(2)));
        assert_eq!(load.servers(), 2);
    }

    #[test]
    fn spawns_under_way_count_toward_a_server_and_a_listing_leaves_them() {
        let mut load = Load::with_servers(1);
        assert_eq!(load.place(2), 0);
        assert_eq!(load.place(2), 0);
        let mark = load.mark();
        load.listed(0, [].iter(), mark);
        assert_eq!(
            load.place(2),
            1,
            "two spawns are still under way on server 1"
        );
    }

    #[test]
    fn a_pane_made_while_its_server_was_listed_counts_once() {
        let mut load = Load::with_servers(1);
        make(&mut load, 1, 3);
        let mark = load.mark();
        // Made during the listing: the listing shows %2 and misses %3.
        make(&mut load, 2, 3);
        make(&mut load, 3, 3);
        load.listed(0, [pane(1), pane(2)].iter(), mark);
        assert_eq!(load.place(3), 1, "server 1 holds three, not four nor two");
        // A pane gone by hand is gone at the next listing.
        let mark = load.mark();
        load.listed(0, [pane(1), pane(3)].iter(), mark);
        assert_eq!(load.place(3), 0, "server 1 holds two again");
    }

    #[test]
    fn a_pane_closed_while_its_server_was_listed_is_not_counted_again() {
        let mut load = Load::with_servers(1);
        make(&mut load, 1, 2);
        make(&mut load, 2, 2);
        let mark = load.mark();
        load.closed(0, &pane(2));
        // The listing began before the close and still shows %2.
        load.listed(0, [pane(1), pane(2)].iter(), mark);
        assert_eq!(load.place(2), 0, "server 1 holds one");
    }

    #[test]
    fn a_server_found_later_is_known_with_those_before_it() {
        let mut load = Load::with_servers(1);
        load.open(3);
        assert_eq!(load.servers(), 4);
        load.open(1);
        assert_eq!(load.servers(), 4);
        assert_eq!(Load::with_servers(0).servers(), 0);
    }

    #[test]
    fn past_the_last_server_new_panes_go_to_the_least_loaded() {
        let mut load = Load::with_servers(MAX_SERVERS);
        let three = [pane(1), pane(2), pane(3)];
        for k in 0..MAX_SERVERS {
            load.listed(k, three.iter(), 0);
        }
        load.listed(17, three[..1].iter(), 0);
        assert_eq!(load.place(3), 17);
        assert_eq!(load.servers(), MAX_SERVERS);
    }

    #[test]
    fn a_per_server_count_of_zero_still_places_one_pane_a_server() {
        let mut load = Load::with_servers(1);
        assert_eq!(load.place(0), 0);
        assert_eq!(load.place(0), 1);
    }

    #[test]
    fn ids_name_their_server_and_read_back() {
        let pane = PaneId("%7".into());
        assert_eq!(outer_id(0, &pane), pane);
        assert_eq!(outer_id(2, &pane), PaneId("3:%7".into()));
        for index in [0, 1, 2, MAX_SERVERS - 1] {
            assert_eq!(
                inner_id(&outer_id(index, &pane)),
                Some((index, pane.clone()))
            );
        }
        assert_eq!(server_name("fleetd-ab", 0), "fleetd-ab");
        assert_eq!(server_name("fleetd-ab", 2), "fleetd-ab@3");
    }

    #[test]
    fn ids_no_server_gave_are_refused() {
        for bad in [
            "",
            "7",
            "1:%7",
            "0:%7",
            "3:7",
            ":%7",
            "-2:%7",
            "+2:%7",
            "2 :%7",
            "257:%7",
            "99999999999999999999999:%7",
            "w1:p2",
            "02:%7",
            "2:%7:%8",
            "%",
            "%x",
            "2:%",
            "2:%7 ",
        ] {
            assert_eq!(inner_id(&PaneId(bad.into())), None, "{bad:?}");
        }
    }
}
