//! `[architects]`: the slots of the advisory architects a lead consults with `fleet_consult`
//! (DESIGN §1; CB-500's two short-lived advisers on different model families).

use std::collections::BTreeSet;

use fleet_core::entity::validate_worker_name;
use serde::Deserialize;

use super::family::{Family, family};
use super::{DEFAULT_NUDGE_INTERVAL_S, MAX_CONFIG_WAIT_S, ProfileConfig, within};

/// The most architect slots a gateway may declare.
pub const MAX_SLOTS: usize = 8;

/// The `[architects]` block.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchitectsConfig {
    /// The slots, in the order a consult reports them.
    pub slots: Vec<SlotConfig>,
    /// The least time between two nudges into an architect's pane while a message waits for
    /// it to pull (only its brief is typed in).
    pub nudge_interval_s: u64,
    /// Lets two slots run models of one family (see [`super::family`]), which is refused
    /// otherwise: two advisers of one maker agreeing is weak evidence, so it takes saying so.
    pub allow_same_family: bool,
}

impl Default for ArchitectsConfig {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            nudge_interval_s: DEFAULT_NUDGE_INTERVAL_S,
            allow_same_family: false,
        }
    }
}

/// One architect slot.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotConfig {
    /// The slot's name, which its architect goes by while it lives.
    pub name: String,
    /// The profile its architect is started from.
    pub profile: String,
    /// The host it is started on (through the control plane); this one when absent.
    #[serde(default)]
    pub host: Option<String>,
    /// How long its architect lives on after its answer, for a follow-up by name; stopped at
    /// once when 0.
    #[serde(default)]
    pub keep_s: u64,
}

impl ArchitectsConfig {
    /// Checks the slots against the profiles (`profiles`, this host's: a slot on another host is
    /// that host's to check) and the names already taken by leads (`leads`).
    pub fn validate(
        &self,
        profiles: &[ProfileConfig],
        own_host: Option<&str>,
        leads: &BTreeSet<&str>,
    ) -> Result<(), String> {
        within(
            "architects.nudge_interval_s",
            self.nudge_interval_s,
            1,
            MAX_CONFIG_WAIT_S,
        )?;
        if self.slots.len() > MAX_SLOTS {
            return Err(format!(
                "architects.slots has {} slots; at most {MAX_SLOTS} are allowed",
                self.slots.len()
            ));
        }
        let mut names = BTreeSet::new();
        let mut families: Vec<(Family, &str)> = Vec::new();
        for slot in &self.slots {
            validate_worker_name(&slot.name)
                .map_err(|e| format!("architects.slots name: {}", e.message))?;
            if !names.insert(slot.name.as_str()) {
                return Err(format!(
                    "architects.slots names '{}' twice: each slot needs a name of its own",
                    slot.name
                ));
            }
            if leads.contains(slot.name.as_str()) {
                return Err(format!(
                    "architects.slots '{}' has a lead's name: pick another",
                    slot.name
                ));
            }
            if let Some(host) = &slot.host {
                fleet_core::entity::validate_name("architects.slots host", host)
                    .map_err(|e| e.message)?;
            }
            within(
                &format!("architects.slots '{}' keep_s", slot.name),
                slot.keep_s,
                0,
                MAX_CONFIG_WAIT_S,
            )?;
            let elsewhere = slot.host.as_deref().is_some_and(|h| Some(h) != own_host);
            if elsewhere {
                continue;
            }
            let profile = profiles
                .iter()
                .find(|p| p.name == slot.profile)
                .ok_or_else(|| {
                    let known: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
                    format!(
                        "architects.slots '{}' names profile '{}', which is not configured (profiles: {})",
                        slot.name,
                        slot.profile,
                        known.join(", ")
                    )
                })?;
            families.push((family(profile), slot.name.as_str()));
        }
        if self.allow_same_family {
            return Ok(());
        }
        match first_shared(&families) {
            Some((family, first, second)) => Err(one_family(family, first, second)),
            None => Ok(()),
        }
    }

    /// The slot called `name`.
    pub fn slot(&self, name: &str) -> Option<&SlotConfig> {
        self.slots.iter().find(|s| s.name == name)
    }
}

/// The first family two of `slots` share, with those two slots' names.
fn first_shared<'a>(slots: &'a [(Family, &'a str)]) -> Option<(&'a Family, &'a str, &'a str)> {
    slots.iter().enumerate().find_map(|(i, (family, name))| {
        let (_, other) = slots.iter().skip(i + 1).find(|(f, _)| f == family)?;
        Some((family, *name, *other))
    })
}

/// Why slots `first` and `second`, both on `family`, are refused, and what to do instead.
fn one_family(family: &Family, first: &str, second: &str) -> String {
    let on = match family {
        Family::Known(id) => format!("are both on the {id} model family"),
        Family::Unknown(what) => format!("both run {what}"),
    };
    format!(
        "architects.slots '{first}' and '{second}' {on}: architects are there to bring two model families to one brief, so give one of them a profile on another family (another maker's model), or set allow_same_family = true under [architects] to consult them as they are"
    )
}

#[cfg(test)]
mod tests {
    use super::super::ProfileKind;
    use super::*;

    fn profile(name: &str, kind: ProfileKind, model: Option<&str>) -> ProfileConfig {
        let mut p = ProfileConfig::command(name, vec!["prog".into()]);
        p.kind = kind;
        p.model = model.map(Into::into);
        p
    }

    fn slot(name: &str, profile: &str) -> SlotConfig {
        SlotConfig {
            name: name.into(),
            profile: profile.into(),
            host: None,
            keep_s: 0,
        }
    }

    fn check_with(
        slots: Vec<SlotConfig>,
        profiles: &[ProfileConfig],
        allow_same_family: bool,
    ) -> Result<(), String> {
        let leads = BTreeSet::from(["alice"]);
        ArchitectsConfig {
            slots,
            allow_same_family,
            ..ArchitectsConfig::default()
        }
        .validate(profiles, Some("here"), &leads)
    }

    fn check(slots: Vec<SlotConfig>, profiles: &[ProfileConfig]) -> Result<(), String> {
        check_with(slots, profiles, false)
    }

    #[test]
    fn two_slots_on_one_family_are_refused_unless_allowed() {
        let profiles = [
            profile("claude", ProfileKind::ClaudeCode, None),
            profile("sonnet", ProfileKind::ClaudeCode, Some("claude-sonnet-4-5")),
            profile(
                "oc-claude",
                ProfileKind::Opencode,
                Some("anthropic/claude-opus-4-1"),
            ),
            profile("gpt", ProfileKind::Opencode, Some("openai/gpt-5.6")),
            profile("also-gpt", ProfileKind::Opencode, Some("GPT-5.6")),
            profile("oc", ProfileKind::Opencode, None),
            profile("oc2", ProfileKind::Opencode, None),
            profile("prog", ProfileKind::Command, None),
            profile("prog2", ProfileKind::Command, None),
        ];
        for (first, second, says) in [
            ("claude", "sonnet", "are both on the anthropic model family"),
            (
                "claude",
                "oc-claude",
                "are both on the anthropic model family",
            ),
            ("gpt", "also-gpt", "are both on the openai model family"),
            // What fleetd cannot name is one family only if it is the same thing.
            ("oc", "oc2", "both run the default model of opencode"),
            ("prog", "prog", "both run the program of profile 'prog'"),
        ] {
            let slots = || vec![slot("arch-a", first), slot("arch-b", second)];
            let err = check(slots(), &profiles).unwrap_err();
            assert!(
                err.contains(&format!("architects.slots 'arch-a' and 'arch-b' {says}"))
                    && err.contains("allow_same_family = true"),
                "{err}"
            );
            check_with(slots(), &profiles, true).unwrap();
        }
        // The first two that share one are named, wherever they are.
        let slots = vec![
            slot("a1", "claude"),
            slot("a2", "gpt"),
            slot("a3", "sonnet"),
        ];
        let err = check(slots, &profiles).unwrap_err();
        assert!(err.contains("'a1' and 'a3'"), "{err}");
        // Unknown families apart: the user's default opencode model, two programs.
        for (first, second) in [("claude", "oc"), ("prog", "prog2"), ("gpt", "prog")] {
            check(
                vec![slot("arch-a", first), slot("arch-b", second)],
                &profiles,
            )
            .unwrap();
        }
    }

    #[test]
    fn two_families_pass_and_every_mistake_is_named() {
        let profiles = [
            profile("claude", ProfileKind::ClaudeCode, None),
            profile("gpt", ProfileKind::Opencode, Some("openai/gpt-5.6")),
        ];
        check(
            vec![slot("arch-claude", "claude"), slot("arch-gpt", "gpt")],
            &profiles,
        )
        .unwrap();
        // A slot on another host is that host's to check.
        let mut far = slot("arch-far", "claude");
        far.host = Some("hostb".into());
        check(vec![slot("arch-claude", "claude"), far.clone()], &profiles).unwrap();
        far.profile = "only-there".into();
        check(vec![slot("arch-claude", "claude"), far], &profiles).unwrap();
        for (slots, says) in [
            (
                vec![slot("a1", "nope")],
                "profile 'nope', which is not configured (profiles: claude, gpt)",
            ),
            (
                vec![slot("a1", "claude"), slot("a1", "gpt")],
                "names 'a1' twice",
            ),
            (vec![slot("alice", "claude")], "a lead's name"),
            (vec![slot("a.b", "claude")], "architects.slots name"),
        ] {
            let err = check(slots, &profiles).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let mut long = slot("a1", "claude");
        long.keep_s = MAX_CONFIG_WAIT_S + 1;
        let err = check(vec![long], &profiles).unwrap_err();
        assert!(err.contains("'a1' keep_s"), "{err}");
        let many = (0..=MAX_SLOTS)
            .map(|i| slot(&format!("a{i}"), "claude"))
            .collect();
        assert!(check(many, &profiles).unwrap_err().contains("at most"));
    }
}
