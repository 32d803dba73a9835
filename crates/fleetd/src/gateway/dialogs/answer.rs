//! Answering a dialog: the lead's choice checked against the dialog it saw, the keys that make
//! it computed and pressed (a menu's cursor moved and seen to arrive before Enter), the dialog
//! seen to go, and a turn the program ended by the answer ended for the lead too.

use super::*;
impl LocalPlane {
    /// The local side of [`Gateway::choose_for`].
    pub(in crate::gateway) async fn choose_for(
        self: &Arc<Self>,
        caller: &Caller,
        turn_id: &str,
        choice: &str,
        wait: Duration,
        ct: &CancellationToken,
    ) -> Result<SendResult, FleetError> {
        check_tool(&caller.entity, Tool::Send)?;
        let me = caller.entity.gid;
        let (question, waiter) = {
            let mut sessions = self.sessions.lock();
            let Some(dialog) = sessions.asks.for_answer(turn_id, me)?.dialog() else {
                return Err(FleetError::invalid(format!(
                    "{turn_id} is a question, which takes text, not a choice: answer with fleet_send{{turn_id, message}}"
                )));
            };
            dialog.pick(choice)?;
            take_answer(&mut sessions, turn_id, me)?
        };
        // A dialog of a start here: the answer waits for what follows it.
        let here = matches!(waiter, Waiter::Screen);
        let starting = here && question.in_task.is_none() && self.is_starting(question.from);
        match waiter {
            Waiter::Screen => self.choose(&question, choice.to_string()).await?,
            // A dialog on another host: the choice goes back there, to be checked and pressed.
            Waiter::Call(call) => {
                if call.send(Ok(choice.to_string())).is_err() {
                    return Err(FleetError::new(
                        ErrorCode::TooLate,
                        format!("the dialog {turn_id} is over; your choice was not delivered"),
                    ));
                }
            }
        }
        // The choice is the lead's answer: words of the dialog, not to be logged.
        tracing::info!(gid = %question.from, %turn_id, choice = %crate::logs::summary(choice), "dialog answered");
        if starting {
            return self
                .await_started(me, question.from, turn_id, wait, ct)
                .await;
        }
        // A dialog of a start on another host (a dialog afar with no task is one): pressed there.
        if !here && question.in_task.is_none() {
            return Ok(SendResult::Answered {
                turn_id: turn_id.to_string(),
                note: Some(format!(
                    "host '{}' presses it; '{}' goes on starting there: fleet_list shows it idle once it is ready, and a dialog it stops on next comes up on your next fleet call",
                    question.host, question.from_name
                )),
            });
        }
        self.after_answer(caller, turn_id, question.from, question.in_task, wait, ct)
            .await
    }

    /// Answers `dialog` (asked for a worker here) with `choice`, checked against its choices:
    /// presses that choice's key, or for a menu's option the arrows that move its cursor there
    /// and, once the screen shows it there, Enter; then waits for the dialog to go away. What is
    /// on the screen is looked at before anything is pressed: a dialog other than the one the
    /// lead saw is `too_late`, a cursor that does not reach the option or a dialog that stays
    /// up is `not_pressed`, and whatever dialog is on the screen then is asked afresh at once.
    pub(in crate::gateway) async fn choose(
        self: &Arc<Self>,
        dialog: &AskView,
        choice: String,
    ) -> Result<(), FleetError> {
        let gid = dialog.from;
        // However this ends (dropped half-way included), the watcher then looks at the screen
        // again; until then it leaves it to this answer (see `take_answer`).
        let _answering = Answering {
            gateway: self,
            gid,
            turn: &dialog.turn_id,
        };
        let shown = dialog
            .dialog()
            .ok_or_else(|| FleetError::invalid(format!("{} is no dialog", dialog.turn_id)))?;
        let answer = shown.pick(&choice)?;
        let gone = || {
            FleetError::new(
                ErrorCode::TooLate,
                format!(
                    "the dialog {} is no longer on '{}''s screen (answered there, or another came in its place); nothing was pressed",
                    dialog.turn_id, dialog.from_name
                ),
            )
        };
        let (pane, markers, forced, turn_over) = self.mark_answering(dialog).ok_or_else(gone)?;
        let screen = Screen {
            pane: &pane,
            markers: &markers,
            forced,
            turn_over: &turn_over,
        };
        // What is on the screen now must be the dialog the lead saw: else the key would answer
        // something else (the dialog was answered in the pane, another came in its place).
        let now = match self.read_screen(&screen).await {
            Ok(now) => now,
            Err(e) => {
                let err = FleetError::new(
                    ErrorCode::PaneHost,
                    format!("cannot look at '{}''s screen: {e}", dialog.from_name),
                );
                return Err(self.ask_afresh(gid, &dialog.turn_id, &screen, err).await);
            }
        };
        let before = shown_counts(&now.0, screen.turn_over);
        let now = match now.1 {
            Some(now) if now == shown => now,
            _ => {
                let err = gone();
                return Err(self.ask_afresh(gid, &dialog.turn_id, &screen, err).await);
            }
        };
        let pressed = self
            .press(&screen, &now, answer, (&choice, &dialog.from_name))
            .await;
        if let Err(e) = pressed {
            return Err(self.ask_afresh(gid, &dialog.turn_id, &screen, e).await);
        }
        // Asked again at once if it is still there: the choice is spent either way.
        let still = self.still_shown(&screen, &shown).await;
        if still {
            let err = FleetError::new(
                ErrorCode::NotPressed,
                format!(
                    "'{choice}' was pressed, but the dialog is still on '{}''s screen after {} s",
                    dialog.from_name,
                    GONE_WAIT.as_secs()
                ),
            );
            return Err(self.ask_afresh(gid, &dialog.turn_id, &screen, err).await);
        }
        self.dialog_over(gid, &dialog.turn_id, "it was answered")
            .await;
        // A choice that ends the program's turn (Claude Code's "No") ends the task with it.
        if let Some(marker) = self.turn_over_shown(&screen, before).await {
            self.turn_over(dialog, &marker).await;
        }
        Ok(())
    }

    /// What answering `dialog` looks at (its worker's pane, dialog and turn-over markers, and
    /// whether the pane host says it is blocked), with the open dialog marked as being
    /// answered; `None` when that dialog is no longer the one open on a blocked worker.
    fn mark_answering(&self, dialog: &AskView) -> Option<(PaneId, Vec<String>, bool, Vec<String>)> {
        let mut sessions = self.sessions.lock();
        let session = sessions.panes.get_mut(&dialog.from)?;
        let pane = session.pane().cloned()?;
        if session.status() != WorkerStatus::Blocked {
            return None;
        }
        let looks = (
            session.profile().dialog_markers(),
            matches!(session.host_agent(), Some((_, AgentState::Blocked))),
            session.profile().turn_over_markers(),
        );
        let asked = session
            .dialog_mut()
            .filter(|d| d.question.turn_id == dialog.turn_id)?;
        asked.answering = true;
        Some((pane, looks.0, looks.1, looks.2))
    }

    /// Presses what `answer` takes on the dialog `now` shows: a key, or a menu's cursor moved
    /// to its option and Enter (`choice` and `worker` name them in an error).
    async fn press(
        &self,
        screen: &Screen<'_>,
        now: &Dialog,
        answer: Answer,
        (choice, worker): (&str, &str),
    ) -> Result<(), FleetError> {
        match answer {
            Answer::Press(key) => self.panes.press(screen.pane, key).await.map_err(|e| {
                FleetError::new(
                    ErrorCode::PaneHost,
                    format!("cannot press '{choice}' in '{worker}''s pane: {e}"),
                )
            }),
            Answer::Select(target) => self.select(screen, now, target, (choice, worker)).await,
        }
    }

    /// Whether `shown` is still on the screen after up to [`GONE_WAIT`] for it to go.
    async fn still_shown(&self, screen: &Screen<'_>, shown: &Dialog) -> bool {
        let deadline = Instant::now() + GONE_WAIT;
        loop {
            let showing = matches!(self.read_screen(screen).await, Ok((_, Some(d))) if d == *shown);
            if !showing || Instant::now() >= deadline {
                return showing;
            }
            sleep(GONE_LOOK).await;
        }
    }

    /// Looks for up to [`TURN_OVER_WAIT`] for one of `markers` to show on the screen more
    /// often than the `before` times it did before the choice: the program ended its turn.
    async fn turn_over_shown(&self, screen: &Screen<'_>, before: Vec<usize>) -> Option<String> {
        let markers = screen.turn_over;
        if markers.is_empty() {
            return None;
        }
        let deadline = Instant::now() + TURN_OVER_WAIT;
        loop {
            if let Ok((text, _)) = self.read_screen(screen).await
                && let Some(marker) = newly_shown(&text, markers, &before)
            {
                return Some(marker);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(GONE_LOOK).await;
        }
    }

    /// `gid`'s program ended its turn without an answer after its dialog was answered (it
    /// shows `marker`): its task in flight fails, saying so, and it takes its next task.
    pub(super) async fn turn_over(self: &Arc<Self>, dialog: &AskView, marker: &str) {
        let (gid, name) = (dialog.from, &dialog.from_name);
        // Only the task the dialog stopped in: one answered meanwhile, or the next one, is not
        // this turn's.
        let task = dialog.in_task.and_then(|stopped_in| {
            self.sessions
                .lock()
                .panes
                .get_mut(&gid)
                .and_then(|session| session.end_turn_of(stopped_in))
        });
        let Some(task) = task else {
            return;
        };
        tracing::info!(%gid, msg_id = %task.msg_id, "the worker's program ended its turn on a dialog's choice");
        // The marker is the profile's text, not the worker's screen.
        let reason = format!(
            "'{name}' ended its turn without an answer after the dialog it stopped on was answered: its program shows \"{marker}\" and waits for what to do instead; send it a new task"
        );
        self.turn_failed(&task, &reason).await;
    }

    /// Moves the cursor of the menu `now` shows to its option `target` and, once the screen
    /// shows it there on the same dialog, presses Enter.
    async fn select(
        &self,
        screen: &Screen<'_>,
        now: &Dialog,
        target: usize,
        (choice, worker): (&str, &str),
    ) -> Result<(), FleetError> {
        let not_pressed = |why: String| {
            FleetError::new(
                ErrorCode::NotPressed,
                format!("'{choice}' was not confirmed in '{worker}''s dialog: {why}"),
            )
        };
        let pane_host = |e: fleet_mux::MuxError| {
            FleetError::new(
                ErrorCode::PaneHost,
                format!("cannot press keys in '{worker}''s pane: {e}"),
            )
        };
        let moves = now.moves_to(target).ok_or_else(|| {
            not_pressed(
                "where the cursor of its menu is cannot be read; nothing was pressed".into(),
            )
        })?;
        for key in moves {
            self.panes
                .press(screen.pane, key)
                .await
                .map_err(pane_host)?;
        }
        let deadline = Instant::now() + CURSOR_WAIT;
        loop {
            match self.read_screen(screen).await {
                Ok((_, Some(seen))) if seen == *now && seen.cursor_on(target) => break,
                Ok((_, Some(seen))) if seen == *now => {}
                _ => {
                    return Err(FleetError::new(
                        ErrorCode::TooLate,
                        format!(
                            "'{worker}''s dialog went away or changed while its cursor moved to '{choice}'; Enter was not pressed"
                        ),
                    ));
                }
            }
            if Instant::now() >= deadline {
                return Err(not_pressed(format!(
                    "the cursor of its menu did not reach it within {} ms; Enter was not pressed",
                    CURSOR_WAIT.as_millis()
                )));
            }
            sleep(GONE_LOOK).await;
        }
        self.panes
            .press(screen.pane, Key::Enter)
            .await
            .map_err(pane_host)
    }

    /// What a screen shows now, and the dialog on it, if any.
    async fn read_screen(
        &self,
        screen: &Screen<'_>,
    ) -> Result<(String, Option<Dialog>), fleet_mux::MuxError> {
        let snapshot = self.panes.snapshot(screen.pane).await?;
        let dialog = self
            .dialog_on(screen.pane, &snapshot.text, screen.markers, screen.forced)
            .await;
        Ok((snapshot.text, dialog))
    }

    /// The dialog on `pane`'s screen `text`: read again with its colours when it has a row of
    /// options whose current one shows only in colour (else it offers only its hints).
    pub(super) async fn dialog_on(
        &self,
        pane: &PaneId,
        text: &str,
        markers: &[String],
        forced: bool,
    ) -> Option<Dialog> {
        let dialog = read_dialog(text, markers, forced)?;
        if !dialog.in_colour || dialog.cursor.is_some() {
            return Some(dialog);
        }
        match self.panes.styled(pane).await {
            Ok(styled) => read_dialog_styled(&styled, markers, forced),
            Err(e) => {
                tracing::debug!(%pane, error = %e, "cannot read a dialog's colours; its hints are offered");
                Some(dialog)
            }
        }
    }

    /// The answer to dialog `turn` of `gid` did not take (`err`): that dialog is over, and the
    /// one on the screen now, if one holds still there, is asked at once; `err` says which.
    async fn ask_afresh(
        self: &Arc<Self>,
        gid: Gid,
        turn: &str,
        screen: &Screen<'_>,
        err: FleetError,
    ) -> FleetError {
        self.dialog_over(gid, turn, "its answer did not take").await;
        let first = self.read_screen(screen).await;
        sleep(GONE_LOOK).await;
        let second = self.read_screen(screen).await;
        let asked = match (first, second) {
            (Ok((_, Some(a))), Ok((text, Some(b)))) if a == b => {
                let before = shown_counts(&text, screen.turn_over);
                self.dialog_shown(gid, b, before).await
            }
            _ => None,
        };
        // The watcher may have asked it first.
        let asked = asked.or_else(|| {
            let sessions = self.sessions.lock();
            let open = sessions.panes.get(&gid)?.dialog()?;
            Some(open.question.turn_id.clone())
        });
        match asked {
            Some(again) => FleetError::new(
                err.code,
                format!(
                    "{}; the dialog on the screen now is asked as {again} (fleet_poll and fleet_list show it)",
                    err.message
                ),
            ),
            None => err,
        }
    }
}

/// Takes the ask `turn` for `lead`'s answer (`take_for_answer`); a dialog of a worker
/// here is marked as being answered in the same step, so the watcher, which sees its ask
/// taken, leaves its screen to the answer (see [`Answering`]).
pub(in crate::gateway) fn take_answer(
    sessions: &mut Sessions,
    turn: &str,
    lead: Gid,
) -> Result<(AskView, Waiter), FleetError> {
    let taken = sessions.asks.take_for_answer(turn, lead)?;
    if let (question, Waiter::Screen) = &taken
        && let Some(dialog) = sessions
            .panes
            .get_mut(&question.from)
            .and_then(|s| s.dialog_mut())
            .filter(|d| d.question.turn_id == turn)
    {
        dialog.answering = true;
    }
    Ok(taken)
}

/// A dialog's answer being pressed: once it is over, however it ends (dropped half-way
/// included), the watcher looks at that screen again.
struct Answering<'a> {
    gateway: &'a LocalPlane,
    gid: Gid,
    turn: &'a str,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let mut sessions = self.gateway.sessions.lock();
        if let Some(dialog) = sessions
            .panes
            .get_mut(&self.gid)
            .and_then(|s| s.dialog_mut())
            .filter(|d| d.question.turn_id == self.turn)
        {
            dialog.answering = false;
        }
    }
}

/// Where to read a worker's dialogs.
struct Screen<'a> {
    pane: &'a PaneId,
    markers: &'a [String],
    forced: bool,
    /// Its profile's `turn_over_markers`.
    turn_over: &'a [String],
}
