//! Typing a task into a pane and making sure it was submitted.
//!
//! The riskiest step of the whole system: Enter swallowed, text merged, agent not ready. So:
//! paste the text (bracketed when the program asked for it), wait the profile's pause, press
//! Enter as a separate key, and *verify* the submit, by the agent calling in or by the screen
//! showing the input was taken; press Enter once more if not; else report not submitted.
//! Verification, not fixed sleeps, is the mechanism. A program that has only just started may
//! still be drawing its first screen, and drop keys meanwhile: the first keys of a session can
//! be made to wait until its screen holds still ([`Settle`]; the decision is [`SettleWatch`]).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use crate::{MuxError, OutputWatch, PaneHost, PaneId, Snapshot};

/// The first pause between screen checks where the host does not report output; doubled up
/// to [`MAX_CHECK_INTERVAL`]. A check is a round trip to the host (~0.1 ms over tmux's
/// control connection), so start small.
const FIRST_CHECK_INTERVAL: Duration = Duration::from_micros(250);
/// How long the screen must hold still after the paste showed, before Enter is pressed: an echo
/// may come in pieces.
const SETTLE_STILL: Duration = Duration::from_millis(1);
/// How long it must hold still once it shows the whole of a one-line paste
/// ([`shows_whole_paste`]): long enough for the rest of what the program writes with the echo
/// in other writes (a redraw of its line, a wrap at the pane's edge), which follow at once.
const WHOLE_STILL: Duration = Duration::from_micros(200);
/// The longest pause between screen checks: each check costs a round trip to the host. Where
/// the host reports output, every check waits this long for a write, so a write the host
/// failed to report still gets looked at.
const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// How long a paste may take to show on screen before Enter is pressed anyway (a program that
/// does not echo never shows it).
const ECHO_WAIT: Duration = Duration::from_millis(250);
/// How often a settling screen is looked at: finer than a redraw at a usual frame rate, so a
/// screen still being drawn is seen to change.
const SETTLE_CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// How a screen must settle before keys go in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settle {
    /// How long the screen must hold still.
    pub still: Duration,
    /// The longest wait for that: a screen that never holds still (a clock) gets the keys
    /// after this anyway.
    pub limit: Duration,
}

/// What a [`SettleWatch`] makes of the latest look at the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The screen held still long enough: type now.
    Still,
    /// It kept changing until the limit: type anyway.
    GaveUp,
    /// Look again after this long.
    LookAgainIn(Duration),
}

/// Watches a screen settle. Pure: it is told what the screen showed and when (the time since
/// the watch began), and says whether to type, or when to look again.
#[derive(Clone, Debug)]
pub struct SettleWatch {
    settle: Settle,
    /// The screen seen last, and since when it has shown that.
    last: Option<(Snapshot, Duration)>,
}

impl SettleWatch {
    /// A watch that has seen nothing yet.
    pub fn new(settle: Settle) -> Self {
        Self { settle, last: None }
    }

    /// Takes in that the screen showed `screen` at `at` (since the watch began).
    pub fn look(&mut self, screen: Snapshot, at: Duration) -> Settled {
        let since = match &self.last {
            Some((seen, since)) if *seen == screen => *since,
            _ => {
                self.last = Some((screen, at));
                at
            }
        };
        let held = at.saturating_sub(since);
        if held >= self.settle.still {
            return Settled::Still;
        }
        if at >= self.settle.limit {
            return Settled::GaveUp;
        }
        Settled::LookAgainIn(
            (self.settle.still - held)
                .min(self.settle.limit - at)
                .min(SETTLE_CHECK_INTERVAL),
        )
    }
}

/// How to type into one kind of program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectOptions {
    /// Pause between the paste and Enter (some TUIs need time to take a paste in).
    pub enter_pause: Duration,
    /// How long to watch for the submit after each Enter.
    pub verify_window: Duration,
    /// Text the program shows when its input box is empty again (Claude Code: `❯` + NBSP).
    /// With it, only that marker (or the agent calling in) proves a submit; without it, any
    /// change of screen or cursor does.
    pub submitted_marker: Option<String>,
    /// When set, nothing is typed until the screen has held still (or the limit passed): for
    /// the first task of a session, whose program may have called in before its screen was
    /// up, and would drop keys typed while it is still drawing.
    pub settle_first: Option<Settle>,
}

/// How an injection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectOutcome {
    /// The submit was seen; `retried` if it took a second Enter.
    Submitted {
        /// Whether the second Enter was needed.
        retried: bool,
    },
    /// Neither Enter was seen to submit.
    NotSubmitted,
    /// The program's input box never showed empty (its `submitted_marker`), so nothing was
    /// typed: text left there (a failed submit, a human's draft) would merge with the task.
    InputNotEmpty,
    /// The caller withheld a step ([`inject_noting`]): nothing was typed, or the task was left
    /// pasted, unsubmitted.
    Withheld,
}

/// Whether `text` (a screen) shows the input box empty: a line on which `marker` is followed
/// by nothing but blanks. The marker alone is not enough: Claude Code draws `❯` and its
/// no-break space in front of what the box holds too (a paste, a draft), so only a line that
/// ends there shows nothing is in it.
pub fn shows_empty_input(text: &str, marker: &str) -> bool {
    !marker.is_empty()
        && text.lines().any(|line| {
            line.match_indices(marker)
                .any(|(at, _)| line[at + marker.len()..].trim().is_empty())
        })
}

/// How long the screen must hold still after the paste `text` showed (`before` the paste,
/// `after` its echo was first seen): [`WHOLE_STILL`] once the echo is whole, else
/// [`SETTLE_STILL`].
fn settle_span(before: &Snapshot, after: &Snapshot, text: &str) -> Duration {
    if shows_whole_paste(before, after, text) {
        WHOLE_STILL
    } else {
        SETTLE_STILL
    }
}

/// Whether `after` shows the whole of the one-line paste `text`: echoed where the cursor was
/// in `before` ([`whole_at_cursor`]), or, where the host tells no cursor, on the one row that
/// changed ([`whole_on_changed_row`]). This holds only once the last character is on screen
/// (not that the program wrote nothing more after it: [`WHOLE_STILL`] waits for that). Judged
/// only for printable ASCII (a column per character); for anything else (more lines, a tab,
/// wide characters) it is `false`.
fn shows_whole_paste(before: &Snapshot, after: &Snapshot, text: &str) -> bool {
    let shown = text.trim_end();
    if shown.is_empty() || !text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return false;
    }
    match (before.cursor, after.cursor) {
        (Some(was), Some(is)) => whole_at_cursor((was, is), after, text.len(), shown),
        (None, None) => whole_on_changed_row(before, after, shown),
        _ => false,
    }
}

/// The cursor moved from `was` to `is`, on the same row, exactly `width` columns to the right
/// (the paste's, trailing blanks included), and `after`'s row ends with `shown`. A partial echo
/// moves the cursor less.
fn whole_at_cursor(
    (was, is): ((u32, u32), (u32, u32)),
    after: &Snapshot,
    width: usize,
    shown: &str,
) -> bool {
    let (Ok(width), Ok(row)) = (u32::try_from(width), usize::try_from(is.1)) else {
        return false;
    };
    is.1 == was.1
        && was.0.checked_add(width) == Some(is.0)
        && after
            .text
            .lines()
            .nth(row)
            .is_some_and(|line| line.trim_end().ends_with(shown))
}

/// One row changed between `before` and `after` (as many rows in both), and it now reads as it
/// did with `shown` after it, ending there. A partial echo does not end with the whole.
fn whole_on_changed_row(before: &Snapshot, after: &Snapshot, shown: &str) -> bool {
    let (was, is): (Vec<&str>, Vec<&str>) =
        (before.text.lines().collect(), after.text.lines().collect());
    if was.len() != is.len() {
        return false;
    }
    let mut changed = was.iter().zip(&is).filter(|(old, new)| old != new);
    let (Some((old, new)), None) = (changed.next(), changed.next()) else {
        return false;
    };
    new.trim_end()
        .strip_suffix(shown)
        .is_some_and(|head| head.trim_end() == old.trim_end())
}

/// Whether the screen after Enter shows the input was taken.
pub fn looks_submitted(before: &Snapshot, after: &Snapshot, marker: Option<&str>) -> bool {
    match marker {
        Some(marker) => {
            shows_empty_input(&after.text, marker)
                && (!shows_empty_input(&before.text, marker) || before != after)
        }
        None => before.cursor != after.cursor || before.text != after.text,
    }
}

/// Types `text` into `pane` and verifies the submit. `activity` ticks whenever the pane's agent
/// makes an authenticated call; a tick after Enter counts as a submit.
pub async fn inject(
    host: &dyn PaneHost,
    pane: &PaneId,
    text: &str,
    options: &InjectOptions,
    activity: &mut watch::Receiver<u64>,
) -> Result<InjectOutcome, MuxError> {
    inject_noting(host, pane, text, options, activity, &Unnoted).await
}

/// What [`inject_noting`] tells its caller is about to happen, for it to note (a restart that
/// finds the task half typed knows then how far it got). Answering false withholds the step
/// ([`InjectOutcome::Withheld`]).
pub trait Steps {
    /// The first key of the task is to go in once this answers (true); until then nothing of
    /// it can have reached the program. It may be asked while the screen is still looked at.
    fn keys_going(&self) -> impl Future<Output = bool> + Send;
    /// The first Enter under the pasted task is to go in once this answers (true); until then
    /// it cannot have been submitted. It is asked once the paste shows on the screen (or could
    /// not be seen to), while the screen settles.
    fn enter_going(&self) -> impl Future<Output = bool> + Send;
    /// The typing reached `step` (for a trace of where a round trip's time goes; nothing is
    /// withheld by it).
    fn reached(&self, step: Reached) {
        let _ = step;
    }
}

/// A step of typing a task, as it is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reached {
    /// The paste was handed to the pane host.
    Pasted,
    /// The screen showed the paste and held still.
    EchoSeen,
    /// Enter was handed to the pane host.
    Enter,
    /// The submit was seen (the screen, or a call of the agent's).
    SubmitSeen,
}

impl Reached {
    /// Its name in a trace.
    pub fn as_str(self) -> &'static str {
        match self {
            Reached::Pasted => "pasted",
            Reached::EchoSeen => "echo_seen",
            Reached::Enter => "enter",
            Reached::SubmitSeen => "submit_seen",
        }
    }
}

/// Steps nobody notes.
struct Unnoted;

impl Steps for Unnoted {
    async fn keys_going(&self) -> bool {
        true
    }
    async fn enter_going(&self) -> bool {
        true
    }
}

/// [`inject`], telling `steps` before the first key and before the first Enter. Withheld keys
/// type nothing; a withheld Enter leaves the task pasted in the input box, unsubmitted.
pub async fn inject_noting(
    host: &dyn PaneHost,
    pane: &PaneId,
    text: &str,
    options: &InjectOptions,
    activity: &mut watch::Receiver<u64>,
    steps: &impl Steps,
) -> Result<InjectOutcome, MuxError> {
    if let Some(settle) = options.settle_first {
        hold_still(host, pane, settle).await?;
    }
    let first_look = async {
        let mut looks = Looks::new(host, pane).await;
        let mut pre = looks.snapshot().await?;
        if pre.in_mode {
            // A human scrolling back in the pane: the paste would reach the program, but Enter
            // would be eaten by the mode.
            host.leave_mode(pane).await?;
            pre = looks.snapshot().await?;
        }
        Ok::<_, MuxError>((looks, pre))
    };
    let (mut looks, pre, keys_noted) = match &options.submitted_marker {
        // The note waits until the box shows empty: noted with a draft in it, a restart could
        // take the draft for the task.
        Some(marker) => {
            let (mut looks, pre) = first_look.await?;
            let Some(empty) =
                wait_for_marker(&mut looks, marker, options.verify_window, pre).await?
            else {
                return Ok(InjectOutcome::InputNotEmpty);
            };
            (looks, empty, steps.keys_going().await)
        }
        // Nothing to wait for: the note is written while the screen is looked at (it needs
        // only to be in before the first key; a restart that finds it and nothing of the task
        // on the pane types it again).
        None => {
            let (looked, noted) = tokio::join!(first_look, steps.keys_going());
            let (looks, pre) = looked?;
            (looks, pre, noted)
        }
    };
    if !keys_noted {
        return Ok(InjectOutcome::Withheld);
    }
    host.paste(pane, text).await?;
    steps.reached(Reached::Pasted);
    match settled_and_noted(&mut looks, pre, text, options, steps).await? {
        Some(before) => submit_noting(looks, before, options, activity, steps).await,
        None => Ok(InjectOutcome::Withheld),
    }
}

/// After the paste (`text`): the screen with the paste on it, settled (and after the profile's
/// pause before Enter), once the Enter's note answered that it may go; `None` if it may not.
/// The screen is compared against it after Enter, so it must hold the paste, or the paste
/// rendering late would pass for a submit: it holds still for [`SETTLE_STILL`], or for
/// [`WHOLE_STILL`] once it shows the whole of a one-line paste ([`settle_span`]).
async fn settled_and_noted(
    looks: &mut Looks<'_>,
    pre: Snapshot,
    text: &str,
    options: &InjectOptions,
    steps: &impl Steps,
) -> Result<Option<Snapshot>, MuxError> {
    let deadline = Instant::now() + ECHO_WAIT;
    let (echoed, moved) = echo(looks, &pre, deadline).await?;
    let span = settle_span(&pre, &echoed, text);
    tracing::debug!(pane = %looks.pane, moved, ?span, "the paste shows");
    let (before, enter_noted) = if moved && options.enter_pause.is_zero() {
        // The paste shows: the Enter's note is written while the screen settles. A stop in
        // between leaves the task in the input box, where a restart presses Enter, as it
        // would without the note.
        let settled = async {
            let held = still(looks, echoed, deadline, span).await;
            steps.reached(Reached::EchoSeen);
            held
        };
        let (held, noted) = tokio::join!(settled, steps.enter_going());
        (held?, noted)
    } else {
        let mut before = if moved {
            still(looks, echoed, deadline, span).await?
        } else {
            echoed
        };
        steps.reached(Reached::EchoSeen);
        if !options.enter_pause.is_zero() {
            sleep(options.enter_pause).await;
            before = looks.snapshot().await?;
        }
        (before, steps.enter_going().await)
    };
    Ok(enter_noted.then_some(before))
}

/// The next pause before a look at the screen: where the host reports output, the safety
/// interval (a write wakes the look sooner); else `interval`, growing.
fn next_nap(output: &OutputWatch, interval: Duration) -> Duration {
    if output.is_live() {
        MAX_CHECK_INTERVAL
    } else {
        interval
    }
}

/// Looks at one pane, woken by its writes.
struct Looks<'a> {
    host: &'a dyn PaneHost,
    pane: &'a PaneId,
    /// The pane's writes, or (a host that cannot tell them, a failure) nothing: the looks are
    /// then on a timer.
    output: OutputWatch,
    /// When the last look began.
    looked: Instant,
}

impl<'a> Looks<'a> {
    /// Looks at `pane` from now on, watching its writes where its host tells them.
    async fn new(host: &'a dyn PaneHost, pane: &'a PaneId) -> Self {
        let output = host.watch_output(pane).await.unwrap_or_else(|e| {
            tracing::debug!(%pane, error = %e, "cannot watch the pane's output; looking on a timer");
            OutputWatch::none()
        });
        Looks {
            host,
            pane,
            output,
            looked: Instant::now(),
        }
    }

    /// The screen now; a write after this call began counts as new.
    async fn snapshot(&mut self) -> Result<Snapshot, MuxError> {
        self.output.mark_seen();
        self.looked = Instant::now();
        self.host.snapshot(self.pane).await
    }

    /// Waits for a write of the pane's (at most `nap`), then until `gap` has passed since the
    /// last look: a pane that writes without pause is looked at less and less often (the
    /// caller makes `gap` grow, [`next_gap`]), not at every write.
    async fn write_or_nap(&mut self, nap: Duration, gap: Duration) {
        let live = self.output.is_live();
        tokio::select! {
            () = self.output.changed() => {}
            () = pause(live, nap) => {}
        }
        gap_since(self.looked, gap).await;
    }
}

/// Waits `span`: on tokio's timer where the host reports the pane's writes (`live`: the pause
/// is then only the fallback to a write, and a millisecond more does not matter), else to within
/// microseconds (the pauses are then all there is between looks, and on a round trip's way:
/// tokio's timer would make a 250 µs pause take one to two milliseconds).
async fn pause(live: bool, span: Duration) {
    if live {
        sleep(span).await;
    } else {
        crate::fine::sleep(span).await;
    }
}

/// Presses Enter under what `pane` holds in its input box (`before`: the screen showing it),
/// and verifies the submit; once more if the first was not seen to submit.
pub async fn submit(
    host: &dyn PaneHost,
    pane: &PaneId,
    before: Snapshot,
    options: &InjectOptions,
    activity: &mut watch::Receiver<u64>,
) -> Result<InjectOutcome, MuxError> {
    let looks = Looks::new(host, pane).await;
    submit_noting(looks, before, options, activity, &Unnoted).await
}

/// [`submit`], telling `steps` what it reached.
async fn submit_noting(
    mut looks: Looks<'_>,
    mut before: Snapshot,
    options: &InjectOptions,
    activity: &mut watch::Receiver<u64>,
    steps: &impl Steps,
) -> Result<InjectOutcome, MuxError> {
    let pane = looks.pane;
    for attempt in 0..2 {
        if attempt > 0 {
            before = looks.snapshot().await?;
        }
        activity.borrow_and_update();
        looks.output.mark_seen();
        looks.host.enter(pane).await?;
        steps.reached(Reached::Enter);
        if watch_for_submit(&mut looks, &before, options, activity).await? {
            steps.reached(Reached::SubmitSeen);
            return Ok(InjectOutcome::Submitted {
                retried: attempt > 0,
            });
        }
        tracing::warn!(%pane, attempt, "Enter not seen to submit");
    }
    Ok(InjectOutcome::NotSubmitted)
}

/// Waits until the screen holds still for `settle.still`, or `settle.limit` passes.
pub async fn hold_still(
    host: &dyn PaneHost,
    pane: &PaneId,
    settle: Settle,
) -> Result<(), MuxError> {
    let began = Instant::now();
    let mut watch = SettleWatch::new(settle);
    loop {
        let screen = host.snapshot(pane).await?;
        match watch.look(screen, began.elapsed()) {
            Settled::Still => return Ok(()),
            Settled::GaveUp => {
                tracing::info!(%pane, limit = ?settle.limit, "the screen never held still; typing anyway");
                return Ok(());
            }
            Settled::LookAgainIn(nap) => sleep(nap).await,
        }
    }
}

/// Waits up to `limit` for `marker` (the empty input box) to show; returns the screen showing
/// it, or `None`.
async fn wait_for_marker(
    looks: &mut Looks<'_>,
    marker: &str,
    limit: Duration,
    mut screen: Snapshot,
) -> Result<Option<Snapshot>, MuxError> {
    let deadline = Instant::now() + limit;
    let mut interval = FIRST_CHECK_INTERVAL;
    let mut gap = Duration::ZERO;
    while !shows_empty_input(&screen.text, marker) {
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let nap = next_nap(&looks.output, interval).min(deadline - now);
        looks.write_or_nap(nap, gap).await;
        interval = (interval * 2).min(MAX_CHECK_INTERVAL);
        gap = next_gap(gap);
        screen = looks.snapshot().await?;
    }
    Ok(Some(screen))
}

/// Waits until `gap` has passed since `looked`.
async fn gap_since(looked: Instant, gap: Duration) {
    let since = looked.elapsed();
    if since < gap {
        crate::fine::sleep(gap - since).await;
    }
}

/// Waits (until `deadline`) for the paste's echo: the screen moved away from `pre`. Returns
/// the last screen seen, and whether it moved. Where the host reports the pane's writes, the
/// first look waits for one: a look marks the writes heard as seen before it asks for the
/// screen, so the echo heard during a look that already shows it would pass for one more write
/// after the echo ([`still`] would wait again and look again).
async fn echo(
    looks: &mut Looks<'_>,
    pre: &Snapshot,
    deadline: Instant,
) -> Result<(Snapshot, bool), MuxError> {
    let live = looks.output.is_live();
    let (mut interval, mut gap) = (FIRST_CHECK_INTERVAL, Duration::ZERO);
    let mut last = if live {
        pre.clone()
    } else {
        looks.snapshot().await?
    };
    while last == *pre {
        let now = Instant::now();
        if now >= deadline {
            return Ok((last, false));
        }
        if live {
            looks
                .write_or_nap(MAX_CHECK_INTERVAL.min(deadline - now), gap)
                .await;
            gap = next_gap(gap);
        } else {
            crate::fine::sleep(interval).await;
            interval = (interval * 2).min(MAX_CHECK_INTERVAL);
        }
        last = looks.snapshot().await?;
    }
    Ok((last, true))
}

/// After the echo (`last`), waits (until `deadline`) for the screen to hold still for `span`:
/// where the host reports the pane's writes, once that passes without one; else until two looks
/// that far apart agree. Returns the last screen seen.
async fn still(
    looks: &mut Looks<'_>,
    mut last: Snapshot,
    deadline: Instant,
    span: Duration,
) -> Result<Snapshot, MuxError> {
    if looks.output.is_live() {
        let mut wrote = false;
        while Instant::now() < deadline {
            tokio::select! {
                () = looks.output.changed() => {}
                () = crate::fine::sleep(span) => break,
            }
            looks.output.mark_seen();
            wrote = true;
        }
        if wrote {
            last = looks.snapshot().await?;
        }
        return Ok(last);
    }
    while Instant::now() < deadline {
        crate::fine::sleep(span).await;
        let next = looks.snapshot().await?;
        if next == last {
            return Ok(next);
        }
        last = next;
    }
    Ok(last)
}

async fn watch_for_submit(
    looks: &mut Looks<'_>,
    before: &Snapshot,
    options: &InjectOptions,
    activity: &mut watch::Receiver<u64>,
) -> Result<bool, MuxError> {
    let deadline = Instant::now() + options.verify_window;
    let mut interval = FIRST_CHECK_INTERVAL;
    let mut gap = Duration::ZERO;
    let mut calls_heard = true;
    let live = looks.output.is_live();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let nap = next_nap(&looks.output, interval).min(deadline - now);
        // An agent calling in is proof enough; otherwise look at the screen after a write of
        // the pane's, or after each nap.
        tokio::select! {
            called = activity.changed(), if calls_heard => match called {
                Ok(()) => return Ok(true),
                // The activity sender is gone: only the screen can tell from here on.
                Err(_) => calls_heard = false,
            },
            () = looks.output.changed() => {
                // A call of the agent's may still come first.
                tokio::select! {
                    called = activity.changed(), if calls_heard => match called {
                        Ok(()) => return Ok(true),
                        Err(_) => calls_heard = false,
                    },
                    () = gap_since(looks.looked, gap) => {}
                }
            }
            () = pause(live, nap) => {}
        }
        let after = looks.snapshot().await?;
        if looks_submitted(before, &after, options.submitted_marker.as_deref()) {
            return Ok(true);
        }
        interval = (interval * 2).min(MAX_CHECK_INTERVAL);
        gap = next_gap(gap);
    }
}

/// The least time between two looks woken by writes, after `gap`: none before the first, then
/// from [`FIRST_CHECK_INTERVAL`] doubling up to [`MAX_CHECK_INTERVAL`].
fn next_gap(gap: Duration) -> Duration {
    (gap * 2).clamp(FIRST_CHECK_INTERVAL, MAX_CHECK_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakePanes, Typed};
    use std::sync::Arc;
    use tokio::sync::Notify;

    /// Steps whose notes answer only when the test lets them, each answering `going`; each
    /// tells the test it was asked.
    struct Gated {
        going: (bool, bool),
        asked: [Notify; 2],
        answer: [Notify; 2],
    }

    impl Gated {
        fn new(keys: bool, enter: bool) -> Arc<Self> {
            Arc::new(Gated {
                going: (keys, enter),
                asked: [Notify::new(), Notify::new()],
                answer: [Notify::new(), Notify::new()],
            })
        }

        /// Waits (at most 10 s, so a broken order fails instead of hanging) until note `step`
        /// was asked.
        async fn asked(&self, step: usize) {
            tokio::time::timeout(Duration::from_secs(10), self.asked[step].notified())
                .await
                .expect("the note was asked");
        }

        async fn note(&self, step: usize, going: bool) -> bool {
            self.asked[step].notify_one();
            self.answer[step].notified().await;
            going
        }
    }

    impl Steps for Gated {
        async fn keys_going(&self) -> bool {
            self.note(0, self.going.0).await
        }
        async fn enter_going(&self) -> bool {
            self.note(1, self.going.1).await
        }
    }

    fn quick() -> InjectOptions {
        InjectOptions {
            enter_pause: Duration::ZERO,
            verify_window: Duration::from_secs(5),
            submitted_marker: None,
            settle_first: None,
        }
    }

    /// Types `the task` into a fresh fake pane, its notes taken by `steps`, in a task of its own.
    fn start_typing(
        steps: &Arc<Gated>,
    ) -> (
        Arc<FakePanes>,
        PaneId,
        tokio::task::JoinHandle<Result<InjectOutcome, MuxError>>,
    ) {
        let host = Arc::new(FakePanes::new());
        let pane = host.open();
        let typing = typing_into(&host, &pane, steps, quick());
        (host, pane, typing)
    }

    /// Types `the task` into `pane` of `host` with `options`, its notes taken by `steps`.
    fn typing_into(
        host: &Arc<FakePanes>,
        pane: &PaneId,
        steps: &Arc<Gated>,
        options: InjectOptions,
    ) -> tokio::task::JoinHandle<Result<InjectOutcome, MuxError>> {
        let (h, p, s) = (Arc::clone(host), pane.clone(), Arc::clone(steps));
        tokio::spawn(async move {
            let (_tx, mut activity) = watch::channel(0u64);
            inject_noting(
                h.as_ref(),
                &p,
                "the task",
                &options,
                &mut activity,
                s.as_ref(),
            )
            .await
        })
    }

    #[tokio::test]
    async fn with_a_marker_the_first_key_is_noted_only_once_the_box_shows_empty() {
        let steps = Gated::new(true, true);
        let host = Arc::new(FakePanes::new());
        let pane = host.open();
        host.paste(&pane, "a draft").await.expect("drafted");
        let options = InjectOptions {
            submitted_marker: Some(">".into()),
            verify_window: Duration::from_millis(200),
            ..quick()
        };
        let outcome = typing_into(&host, &pane, &steps, options)
            .await
            .expect("joined")
            .expect("ran");
        assert_eq!(outcome, InjectOutcome::InputNotEmpty);
        // Noted with the draft in the box, a restart would take the draft for the task.
        assert!(
            tokio::time::timeout(Duration::from_millis(10), steps.asked[0].notified())
                .await
                .is_err(),
            "the first key was noted with a draft in the box"
        );
        assert_eq!(host.typed(&pane), vec![Typed::Paste("a draft".into())]);
    }

    #[tokio::test]
    async fn no_key_goes_in_before_its_note_answers_nor_enter_before_the_enters() {
        let steps = Gated::new(true, true);
        let (host, pane, typing) = start_typing(&steps);
        steps.asked(0).await;
        assert!(
            host.typed(&pane).is_empty(),
            "nothing typed before the note"
        );
        steps.answer[0].notify_one();
        steps.asked(1).await;
        tokio::task::yield_now().await;
        assert!(
            !host.typed(&pane).contains(&Typed::Enter),
            "no Enter before its note: {:?}",
            host.typed(&pane)
        );
        steps.answer[1].notify_one();
        let outcome = typing.await.expect("joined").expect("typed");
        assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
        assert_eq!(host.submitted(&pane), vec!["the task".to_string()]);
    }

    #[tokio::test]
    async fn a_withheld_first_key_types_nothing_and_a_withheld_enter_leaves_the_paste() {
        let steps = Gated::new(false, true);
        let (host, pane, typing) = start_typing(&steps);
        steps.asked(0).await;
        steps.answer[0].notify_one();
        assert_eq!(
            typing.await.expect("joined").expect("ran"),
            InjectOutcome::Withheld
        );
        assert!(host.typed(&pane).is_empty());

        let steps = Gated::new(true, false);
        let (host, pane, typing) = start_typing(&steps);
        steps.asked(0).await;
        steps.answer[0].notify_one();
        steps.asked(1).await;
        steps.answer[1].notify_one();
        assert_eq!(
            typing.await.expect("joined").expect("ran"),
            InjectOutcome::Withheld
        );
        assert_eq!(host.typed(&pane), vec![Typed::Paste("the task".into())]);
    }

    fn snap(cursor: (u32, u32), text: &str) -> Snapshot {
        Snapshot {
            cursor: Some(cursor),
            in_mode: false,
            text: text.into(),
        }
    }

    const SETTLE: Settle = Settle {
        still: Duration::from_millis(200),
        limit: Duration::from_millis(1_000),
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_screen_that_holds_still_long_enough_settles() {
        let mut watch = SettleWatch::new(SETTLE);
        // The first look starts the count; looks come back at most every check interval.
        assert_eq!(
            watch.look(snap((0, 0), "ready"), ms(0)),
            Settled::LookAgainIn(SETTLE_CHECK_INTERVAL)
        );
        assert!(matches!(
            watch.look(snap((0, 0), "ready"), ms(150)),
            Settled::LookAgainIn(_)
        ));
        // The rest of the stillness is all that is left to wait.
        assert_eq!(
            watch.look(snap((0, 0), "ready"), ms(190)),
            Settled::LookAgainIn(ms(10))
        );
        assert_eq!(watch.look(snap((0, 0), "ready"), ms(200)), Settled::Still);
    }

    #[test]
    fn a_change_starts_the_count_again() {
        let mut watch = SettleWatch::new(SETTLE);
        watch.look(snap((0, 0), "frame 1"), ms(0));
        watch.look(snap((0, 0), "frame 2"), ms(150));
        // 200 ms after the first look, but only 50 ms after the last change.
        assert!(matches!(
            watch.look(snap((0, 0), "frame 2"), ms(200)),
            Settled::LookAgainIn(_)
        ));
        // A moved cursor is a change too.
        watch.look(snap((1, 0), "frame 2"), ms(300));
        assert!(matches!(
            watch.look(snap((1, 0), "frame 2"), ms(450)),
            Settled::LookAgainIn(_)
        ));
        assert_eq!(watch.look(snap((1, 0), "frame 2"), ms(500)), Settled::Still);
    }

    #[test]
    fn a_screen_that_never_holds_still_gets_the_keys_at_the_limit() {
        let mut watch = SettleWatch::new(SETTLE);
        let mut at = 0;
        let outcome = loop {
            match watch.look(snap((0, 0), &format!("12:00:{at:04}")), ms(at)) {
                Settled::LookAgainIn(nap) => {
                    // Never asked to wait past the limit.
                    assert!(ms(at) + nap <= SETTLE.limit, "{at} + {nap:?}");
                    at += 20;
                }
                done => break done,
            }
        };
        assert_eq!(outcome, Settled::GaveUp);
        assert_eq!(at, 1_000);
    }

    #[test]
    fn looks_woken_by_writes_come_less_and_less_often() {
        let mut gap = Duration::ZERO;
        let mut gaps = Vec::new();
        for _ in 0..12 {
            gap = next_gap(gap);
            gaps.push(gap);
        }
        assert_eq!(gaps[0], FIRST_CHECK_INTERVAL);
        assert_eq!(gaps[1], FIRST_CHECK_INTERVAL * 2);
        assert!(gaps.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(gaps.last(), Some(&MAX_CHECK_INTERVAL));
    }

    #[test]
    fn a_one_line_paste_is_whole_only_once_its_last_character_shows_at_the_cursor() {
        let before = snap((2, 1), "done\n> ");
        // The screen after the paste (cursor, rows), the text pasted, and whether it is whole.
        let cases = [
            ((10, 1), "done\n> the task", "the task", true),
            // Half of it echoed: the cursor is short of where the whole would leave it.
            ((6, 1), "done\n> the ", "the task", false),
            // A text that ends as it starts is not taken for whole at its first half.
            ((5, 1), "done\n> ab ", "ab ab", false),
            ((7, 1), "done\n> ab ab", "ab ab", true),
            // The cursor moved as far, but the row shows something else, or something after it.
            ((10, 1), "done\n> the tusk", "the task", false),
            ((10, 1), "done\n> the task  [2 chars]", "the task", false),
            // Wrapped onto the next row, or scrolled: not judged.
            ((3, 2), "done\n> the tas\nk", "the task", false),
            // Trailing blanks are not drawn, but the cursor went past them.
            ((6, 1), "done\n> ok", "ok  ", true),
        ];
        for (cursor, screen, text, whole) in cases {
            assert_eq!(
                shows_whole_paste(&before, &snap(cursor, screen), text),
                whole,
                "{screen:?} after pasting {text:?}"
            );
        }
    }

    #[test]
    fn where_the_host_tells_no_cursor_a_paste_is_whole_on_the_one_row_it_changed() {
        let cursorless = |text: &str| Snapshot {
            cursor: None,
            in_mode: false,
            text: text.into(),
        };
        let before = cursorless("done\n> \n\n");
        let cases = [
            ("done\n> the task\n\n", "the task", true),
            ("done\n> ok\n\n", "ok  ", true),
            // Half of it, or a text that ends as it starts at its first half.
            ("done\n> the \n\n", "the task", false),
            ("done\n> ab\n\n", "ab ab", false),
            // Something else, or something after it, on the row.
            ("done\n> the tusk\n\n", "the task", false),
            ("done\n> the task  [2 chars]\n\n", "the task", false),
            // Another row changed too (a status line), or the rows moved: not judged.
            ("done!\n> the task\n\n", "the task", false),
            ("done\n> the tas\nk\n", "the task", false),
            ("done\n> the task\n\n\n", "the task", false),
        ];
        for (screen, text, whole) in cases {
            assert_eq!(
                shows_whole_paste(&before, &cursorless(screen), text),
                whole,
                "{screen:?} after pasting {text:?}"
            );
        }
        // A screen with a cursor is never judged against one without.
        assert!(!shows_whole_paste(
            &snap((2, 1), "done\n> "),
            &cursorless("done\n> the task"),
            "the task"
        ));
    }

    #[test]
    fn a_paste_of_more_lines_or_other_characters_is_never_judged_whole() {
        let before = snap((2, 0), "> ");
        for text in ["two\nlines", "a\ttab", "caf\u{e9}", "\u{1b}[31m", "   ", ""] {
            let width = u32::try_from(text.len()).expect("short");
            let after = snap((2 + width, 0), &format!("> {text}"));
            assert!(!shows_whole_paste(&before, &after, text), "{text:?}");
        }
    }

    /// Steps that go at once, telling the time (tokio's) each step is reached.
    #[derive(Default)]
    struct Clocked(std::sync::Mutex<Vec<(Reached, Instant)>>);

    impl Steps for Clocked {
        async fn keys_going(&self) -> bool {
            true
        }
        async fn enter_going(&self) -> bool {
            true
        }
        fn reached(&self, step: Reached) {
            self.0.lock().expect("lock").push((step, Instant::now()));
        }
    }

    /// Types `text` into a fresh fake pane (which shows a paste whole at once) on tokio's
    /// paused clock: how long passed between the paste and the Enter.
    async fn paste_to_enter(text: &str) -> Duration {
        let host = FakePanes::new();
        let pane = host.open();
        let steps = Clocked::default();
        let (_tx, mut activity) = watch::channel(0u64);
        let outcome = inject_noting(&host, &pane, text, &quick(), &mut activity, &steps)
            .await
            .expect("typed");
        assert_eq!(outcome, InjectOutcome::Submitted { retried: false });
        let reached = steps.0.lock().expect("lock").clone();
        let at = |step| {
            reached
                .iter()
                .find(|(s, _)| *s == step)
                .map(|(_, at)| *at)
                .expect("reached")
        };
        at(Reached::Enter) - at(Reached::Pasted)
    }

    #[test]
    fn a_paste_shown_whole_holds_still_briefly_and_any_other_for_the_full_span() {
        let before = snap((2, 0), "> ");
        assert_eq!(
            settle_span(&before, &snap((10, 0), "> the task"), "the task"),
            WHOLE_STILL
        );
        assert_eq!(
            settle_span(&before, &snap((6, 0), "> the "), "the task"),
            SETTLE_STILL
        );
        assert_eq!(
            settle_span(&before, &snap((4, 1), "> the\n  task"), "the\ntask"),
            SETTLE_STILL
        );
        assert!(WHOLE_STILL < SETTLE_STILL);
    }

    #[tokio::test(start_paused = true)]
    async fn even_a_paste_shown_whole_gets_its_enter_only_once_the_screen_held_still() {
        // Its echo whole, what the program writes right after it is still waited for.
        assert!(paste_to_enter("the task").await >= WHOLE_STILL);
        assert!(paste_to_enter("the\ntask").await >= SETTLE_STILL);
    }

    #[test]
    fn without_a_marker_any_change_is_a_submit() {
        let before = snap((5, 0), "> hello");
        assert!(!looks_submitted(&before, &before.clone(), None));
        assert!(looks_submitted(&before, &snap((2, 1), "> hello\n> "), None));
        assert!(looks_submitted(&before, &snap((5, 0), "> hellp"), None));
    }

    #[test]
    fn with_a_marker_only_the_empty_box_is_a_submit() {
        let marker = Some("❯\u{a0}");
        let before = snap((7, 3), "❯ hello");
        // Enter became a newline inside the box: the screen changed, but no submit.
        assert!(!looks_submitted(
            &before,
            &snap((2, 4), "❯ hello\n  "),
            marker
        ));
        assert!(looks_submitted(
            &before,
            &snap((2, 3), "> hello\n❯\u{a0}"),
            marker
        ));
        // The box still holding the text, drawn behind the marker (a backslash and Enter made a
        // newline of the Enter): no submit, however the screen moved.
        let pasted = snap((7, 3), "❯\u{a0}ls \\");
        assert!(!looks_submitted(
            &pasted,
            &snap((2, 4), "❯\u{a0}ls\n  "),
            marker
        ));
    }

    #[test]
    fn the_box_is_empty_only_where_the_marker_ends_its_line() {
        let marker = "❯\u{a0}";
        assert!(shows_empty_input("done.\n❯\u{a0}\n", marker));
        assert!(shows_empty_input(
            "done.\n❯\u{a0}   \n── ? for shortcuts",
            marker
        ));
        assert!(shows_empty_input("│ ❯\u{a0}\u{a0}\n", marker));
        assert!(!shows_empty_input(
            "❯\u{a0}[#t0083] shell 83: a trailing backslash \\",
            marker
        ));
        assert!(!shows_empty_input("❯ half a thought\n", marker));
        assert!(!shows_empty_input("working…\n", marker));
        // A marker earlier on a line does not hide a later one that ends it.
        assert!(shows_empty_input("❯\u{a0}x ❯\u{a0}", marker));
        assert!(!shows_empty_input("anything", ""));
    }
}
