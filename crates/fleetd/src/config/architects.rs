//! `[architects]`: the slots of the advisory architects a lead consults with `fleet_consult`
//! (DESIGN §1; CB-500's two short-lived advisers on different model families).

use std::collections::BTreeSet;

use fleet_core::entity::validate_worker_name;
use serde::Deserialize;

use super::{DEFAULT_NUDGE_INTERVAL_S, MAX_CONFIG_WAIT_S, ProfileConfig, ProfileKind, within};

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
}

impl Default for ArchitectsConfig {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            nudge_interval_s: DEFAULT_NUDGE_INTERVAL_S,
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

/// What tells two architects' models apart: the profile's `model` (its last path segment,
/// case aside: `anthropic/claude-x` and `claude-x` are one model), else the default of its kind
/// of agent, else (a program fleetd cannot see into) the profile itself.
pub fn model_identity(profile: &ProfileConfig) -> String {
    let agent = profile.agent_kind();
    match (&profile.model, agent) {
        (Some(model), _) => {
            let last = model.rsplit('/').next().unwrap_or(model);
            format!("model '{}'", last.to_ascii_lowercase())
        }
        (None, ProfileKind::ClaudeCode | ProfileKind::Opencode) => {
            format!("the default model of {}", agent.as_str())
        }
        (None, _) => format!("the program of profile '{}'", profile.name),
    }
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
        let mut models: Vec<(String, &str)> = Vec::new();
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
            let model = model_identity(profile);
            if let Some((_, other)) = models.iter().find(|(m, _)| *m == model) {
                return Err(format!(
                    "architects.slots '{other}' and '{}' both run {model}: architects are there to bring two model families to one brief, so give each slot a profile on another model",
                    slot.name
                ));
            }
            models.push((model, slot.name.as_str()));
        }
        Ok(())
    }

    /// The slot called `name`.
    pub fn slot(&self, name: &str) -> Option<&SlotConfig> {
        self.slots.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
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

    fn check(slots: Vec<SlotConfig>, profiles: &[ProfileConfig]) -> Result<(), String> {
        let leads = BTreeSet::from(["alice"]);
        ArchitectsConfig {
            slots,
            ..ArchitectsConfig::default()
        }
        .validate(profiles, Some("here"), &leads)
    }

    #[test]
    fn models_are_told_apart_by_name_then_by_kind_then_by_profile() {
        let claude = profile("c", ProfileKind::ClaudeCode, None);
        let sonnet = profile("s", ProfileKind::ClaudeCode, Some("Claude-Sonnet-5"));
        let proxied = profile(
            "o",
            ProfileKind::Opencode,
            Some("anthropic/claude-sonnet-5"),
        );
        let cmd = profile("x", ProfileKind::Command, None);
        assert_eq!(model_identity(&claude), "the default model of claude-code");
        assert_eq!(model_identity(&sonnet), model_identity(&proxied));
        assert_eq!(model_identity(&cmd), "the program of profile 'x'");
    }

    #[test]
    fn two_families_pass_and_every_mistake_is_named() {
        let profiles = [
            profile("claude", ProfileKind::ClaudeCode, None),
            profile("gpt", ProfileKind::Opencode, Some("openai/gpt-5.6")),
            profile("also-gpt", ProfileKind::Opencode, Some("GPT-5.6")),
        ];
        check(
            vec![slot("arch-claude", "claude"), slot("arch-gpt", "gpt")],
            &profiles,
        )
        .unwrap();
        // A slot on another host is that host's to check.
        let mut far = slot("arch-far", "only-there");
        far.host = Some("hostb".into());
        check(vec![slot("arch-claude", "claude"), far], &profiles).unwrap();
        for (slots, says) in [
            (
                vec![slot("arch-gpt", "gpt"), slot("arch-gpt2", "also-gpt")],
                "both run model 'gpt-5.6'",
            ),
            (
                vec![slot("a1", "nope")],
                "profile 'nope', which is not configured (profiles: claude, gpt, also-gpt)",
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
