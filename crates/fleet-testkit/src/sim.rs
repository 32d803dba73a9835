//! The scripted agent's pure parts: a line editor that reads a terminal's bytes the way an
//! agent's input box does (typed keys, bracketed pastes, Enter), and the directives a task may
//! start with to script the agent's behaviour.

/// What the editor makes of the bytes it is fed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Show these bytes (the echo of what was typed or pasted).
    Echo(Vec<u8>),
    /// Enter outside a paste: the input box is submitted.
    Submit(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escape {
    None,
    /// Saw ESC.
    Esc,
    /// Inside a CSI sequence (ESC `[` …).
    Csi,
}

/// An input box: text accumulates until Enter; inside a bracketed paste, Enter is a newline.
#[derive(Debug)]
pub struct LineEditor {
    buffer: Vec<u8>,
    in_paste: bool,
    escape: Escape,
    csi: Vec<u8>,
    last_was_cr: bool,
}

impl Default for LineEditor {
    fn default() -> Self {
        Self::new()
    }
}

impl LineEditor {
    /// An empty input box.
    pub fn new() -> Self {
        Self {
            buffer: Vec::new(),
            in_paste: false,
            escape: Escape::None,
            csi: Vec::new(),
            last_was_cr: false,
        }
    }

    /// Feeds bytes read from the terminal.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut echo = Vec::new();
        for &byte in bytes {
            match self.escape {
                Escape::Esc => {
                    self.escape = if byte == b'[' {
                        Escape::Csi
                    } else {
                        Escape::None
                    };
                    self.csi.clear();
                    continue;
                }
                Escape::Csi => {
                    if (0x40..=0x7e).contains(&byte) {
                        self.escape = Escape::None;
                        if byte == b'~' {
                            match self.csi.as_slice() {
                                b"200" => self.in_paste = true,
                                b"201" => self.in_paste = false,
                                _ => {}
                            }
                        }
                    } else {
                        self.csi.push(byte);
                    }
                    continue;
                }
                Escape::None => {}
            }
            let was_cr = std::mem::replace(&mut self.last_was_cr, byte == b'\r');
            match byte {
                0x1b => self.escape = Escape::Esc,
                b'\r' | b'\n' if self.in_paste && !(byte == b'\n' && was_cr) => {
                    self.buffer.push(b'\n');
                    echo.extend_from_slice(b"\r\n");
                }
                b'\r' | b'\n' => {
                    if byte == b'\n' && was_cr {
                        continue;
                    }
                    if !echo.is_empty() {
                        events.push(Event::Echo(std::mem::take(&mut echo)));
                    }
                    let text = String::from_utf8_lossy(&self.buffer).into_owned();
                    self.buffer.clear();
                    events.push(Event::Submit(text));
                }
                0x7f | 0x08 if self.buffer.pop().is_some() => {
                    echo.extend_from_slice(b"\x08 \x08");
                }
                byte if byte >= 0x20 || byte == b'\t' => {
                    self.buffer.push(byte);
                    echo.push(byte);
                }
                _ => {}
            }
        }
        if !echo.is_empty() {
            events.push(Event::Echo(echo));
        }
        events
    }
}

/// What a task asks the scripted agent to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Directive {
    /// Reply at once with `echo: <task>`.
    Echo(String),
    /// Wait this many milliseconds, then reply with `echo: <rest>`.
    Slow(u64, String),
    /// Wait until the file at this path exists, then reply with `echo: <rest>` (a turn that
    /// lasts until the test says, over a restart of fleetd, say).
    Gate(String, String),
    /// Never reply.
    Never,
    /// Exit with status 3 at once.
    Crash,
    /// Reply `polling`, then wait in `fleet_poll` this many seconds and echo-reply to every task
    /// that arrives through it.
    Poll(u64),
    /// Ask the lead this question with `fleet_ask` (waiting this many seconds), then reply
    /// `asked <question>, heard: <answer>`, or `asked <question>, got <error code>`.
    Ask(u64, String),
    /// Reply with the text of the file at this path, or `cannot read <path>: <why>` (what a
    /// sandboxed agent can reach).
    Read(String),
    /// Reply with the agent's working directory.
    Pwd,
    /// Write this text to the file at this path (relative to the working directory), then
    /// reply `wrote <path>` (or why it could not).
    Write(String, String),
    /// Show `<question> (y/n)` and wait for the key `y` or `n` (a program's own dialog), then
    /// reply `chose y` or `chose n`.
    Confirm(String),
    /// Show a cursor menu, `<question>` over its options (the first one marked `❯`), moved by
    /// the up and down arrows (not past its ends; with `false`, `/stuckmenu`, not at all) and
    /// answered by Enter: then reply `chose <option>`. Esc ends the turn without a reply,
    /// showing `Interrupted by Esc`.
    Menu(String, Vec<String>, bool),
    /// fleetd's nudge (`[fleet] N messages waiting for you: call fleet_poll …`): pull what
    /// waits with `fleet_poll` and echo-reply to each message by its id.
    Pull,
}

impl Directive {
    /// Reads a task's directive: `/slow MS rest`, `/gate PATH rest`, `/never`, `/crash`, `/poll S`,
    /// `/ask S question`, `/read PATH`, `/write PATH TEXT`, `/pwd`, `/confirm question`,
    /// `/menu question | option | option…` (or `/stuckmenu …`), or fleetd's nudge to pull; anything else is
    /// echoed.
    pub fn parse(task: &str) -> Self {
        let trimmed = task.trim_start();
        if trimmed.starts_with("[fleet] ") && trimmed.contains("call fleet_poll") {
            return Directive::Pull;
        }
        let mut words = trimmed.splitn(3, ' ');
        let number = |w: Option<&str>| w.and_then(|w| w.trim().parse::<u64>().ok());
        match words.next() {
            Some("/never") => Directive::Never,
            Some("/crash") => Directive::Crash,
            Some("/slow") => {
                let ms = words.next();
                match number(ms) {
                    Some(ms) => Directive::Slow(ms, words.next().unwrap_or_default().to_string()),
                    None => Directive::Echo(task.to_string()),
                }
            }
            Some("/gate") => match (words.next(), words.next()) {
                (Some(path), rest) if !path.is_empty() => {
                    Directive::Gate(path.to_string(), rest.unwrap_or_default().to_string())
                }
                _ => Directive::Echo(task.to_string()),
            },
            Some("/poll") => match number(words.next()) {
                Some(s) => Directive::Poll(s),
                None => Directive::Echo(task.to_string()),
            },
            Some("/ask") => match number(words.next()) {
                Some(s) => Directive::Ask(s, words.next().unwrap_or_default().to_string()),
                None => Directive::Echo(task.to_string()),
            },
            Some("/pwd") => Directive::Pwd,
            Some("/write") => match (words.next(), words.next()) {
                (Some(path), Some(text)) if !path.is_empty() => {
                    Directive::Write(path.to_string(), text.to_string())
                }
                _ => Directive::Echo(task.to_string()),
            },
            Some("/confirm") => match trimmed.strip_prefix("/confirm ") {
                Some(question) if !question.trim().is_empty() => {
                    Directive::Confirm(question.trim().to_string())
                }
                _ => Directive::Echo(task.to_string()),
            },
            Some(verb @ ("/menu" | "/stuckmenu")) => {
                let mut parts = trimmed[verb.len()..]
                    .split(" | ")
                    .map(|p| p.trim().to_string());
                let question = parts.next().unwrap_or_default();
                let options: Vec<String> = parts.filter(|p| !p.is_empty()).collect();
                if question.is_empty() || options.len() < 2 {
                    Directive::Echo(task.to_string())
                } else {
                    Directive::Menu(question, options, verb == "/menu")
                }
            }
            Some("/read") => match trimmed.strip_prefix("/read ") {
                Some(path) if !path.trim().is_empty() => Directive::Read(path.trim().to_string()),
                _ => Directive::Echo(task.to_string()),
            },
            _ => Directive::Echo(task.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submits(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Submit(text) => Some(text.clone()),
                Event::Echo(_) => None,
            })
            .collect()
    }

    #[test]
    fn typed_text_is_submitted_by_enter() {
        let mut editor = LineEditor::new();
        let events = editor.feed(b"hello\x7fo\r");
        assert_eq!(submits(&events), vec!["hello"]);
        assert!(matches!(&events[0], Event::Echo(bytes) if bytes.starts_with(b"hello")));
    }

    #[test]
    fn enter_inside_a_bracketed_paste_is_a_newline() {
        let mut editor = LineEditor::new();
        let mut events = editor.feed(b"\x1b[200~line one\rline two\r\nline three\x1b[20");
        events.extend(editor.feed(b"1~"));
        assert!(submits(&events).is_empty());
        let events = editor.feed(b"\r");
        assert_eq!(submits(&events), vec!["line one\nline two\nline three"]);
    }

    #[test]
    fn other_escape_sequences_and_controls_are_ignored() {
        let mut editor = LineEditor::new();
        let events = editor.feed(b"a\x1b[Ab\x01c\r\n");
        assert_eq!(submits(&events), vec!["abc"]);
    }

    #[test]
    fn directives_parse() {
        assert_eq!(Directive::parse("/never"), Directive::Never);
        assert_eq!(Directive::parse("/crash now"), Directive::Crash);
        assert_eq!(
            Directive::parse("/slow 250 then this"),
            Directive::Slow(250, "then this".into())
        );
        assert_eq!(Directive::parse("/poll 30"), Directive::Poll(30));
        assert_eq!(
            Directive::parse("/gate /tmp/open then this"),
            Directive::Gate("/tmp/open".into(), "then this".into())
        );
        assert_eq!(Directive::parse("/gate "), Directive::Echo("/gate ".into()));
        assert_eq!(
            Directive::parse("/read /a dir/token"),
            Directive::Read("/a dir/token".into())
        );
        assert_eq!(Directive::parse("/read "), Directive::Echo("/read ".into()));
        assert_eq!(Directive::parse("/pwd"), Directive::Pwd);
        assert_eq!(
            Directive::parse("/write notes.txt two words"),
            Directive::Write("notes.txt".into(), "two words".into())
        );
        assert_eq!(
            Directive::parse("/write notes.txt"),
            Directive::Echo("/write notes.txt".into())
        );
        assert_eq!(
            Directive::parse("/confirm Overwrite it?"),
            Directive::Confirm("Overwrite it?".into())
        );
        assert_eq!(
            Directive::parse("/menu Go on? | No | Yes, and more"),
            Directive::Menu(
                "Go on?".into(),
                vec!["No".into(), "Yes, and more".into()],
                true
            )
        );
        assert_eq!(
            Directive::parse("/stuckmenu Go on? | No | Yes"),
            Directive::Menu("Go on?".into(), vec!["No".into(), "Yes".into()], false)
        );
        assert_eq!(
            Directive::parse("/menu Go on? | only one"),
            Directive::Echo("/menu Go on? | only one".into())
        );
        assert_eq!(
            Directive::parse("/confirm "),
            Directive::Echo("/confirm ".into())
        );
        assert_eq!(
            Directive::parse("[fleet] 2 messages waiting for you: call fleet_poll to read them"),
            Directive::Pull
        );
        assert_eq!(
            Directive::parse("[fleet] hello"),
            Directive::Echo("[fleet] hello".into())
        );
        assert_eq!(
            Directive::parse("/ask 5 which port?"),
            Directive::Ask(5, "which port?".into())
        );
        assert_eq!(
            Directive::parse("/slow x"),
            Directive::Echo("/slow x".into())
        );
        assert_eq!(
            Directive::parse("do it\nnow"),
            Directive::Echo("do it\nnow".into())
        );
    }
}
