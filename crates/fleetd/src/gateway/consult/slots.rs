//! Which architect slots a consult starts, and what each runs: the slots a lead named (pure,
//! from the config), each slot's profile when it runs here, and its model family, read here or
//! named by its host.

use fleet_core::FleetError;

use super::super::views::HostView;
use crate::config::{ProfileConfig, SlotConfig, family};

/// The slots `wanted` names, in configured order, or all of them; an unknown name is refused.
pub(super) fn chosen<'a>(
    configured: &'a [SlotConfig],
    wanted: Option<&[String]>,
) -> Result<Vec<&'a SlotConfig>, FleetError> {
    if configured.is_empty() {
        return Err(FleetError::invalid(
            "no architects are configured: declare them in the config, [architects] slots = [{ name = \"arch-claude\", profile = \"claude\" }, …]",
        ));
    }
    let Some(wanted) = wanted else {
        return Ok(configured.iter().collect());
    };
    let names: Vec<&str> = configured.iter().map(|s| s.name.as_str()).collect();
    if let Some(unknown) = wanted.iter().find(|w| !names.contains(&w.as_str())) {
        return Err(FleetError::invalid(format!(
            "no architect slot is named '{}' (slots: {})",
            unknown.escape_debug(),
            names.join(", ")
        )));
    }
    if wanted.is_empty() {
        return Err(FleetError::invalid(
            "slots is empty: leave it out to consult every architect",
        ));
    }
    Ok(configured
        .iter()
        .filter(|s| wanted.contains(&s.name))
        .collect())
}

/// The profile `slot`'s architect runs, from `profiles`, when it runs on this host (`host_id`):
/// only this host's profiles are known here, and one of the same name elsewhere may differ.
pub(super) fn own_profile<'a>(
    profiles: &'a [ProfileConfig],
    slot: &SlotConfig,
    host_id: &str,
) -> Option<&'a ProfileConfig> {
    if slot.host.as_deref().is_some_and(|h| h != host_id) {
        return None;
    }
    profiles.iter().find(|p| p.name == slot.profile)
}

/// The model family of `slot`: of its profile here (`own`, when it runs on this host), else as
/// the slot's host named it for that profile in its presence (`hosts`, as the roster knows them).
pub(super) fn slot_family(
    slot: &SlotConfig,
    own: Option<&ProfileConfig>,
    hosts: &[HostView],
) -> Option<String> {
    if let Some(profile) = own {
        return family(profile).id().map(String::from);
    }
    let host = slot.host.as_deref()?;
    hosts
        .iter()
        .find(|h| h.host == host)?
        .families
        .get(&slot.profile)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;

    fn slot(name: &str) -> SlotConfig {
        SlotConfig {
            name: name.into(),
            profile: "p".into(),
            host: None,
            keep_s: 0,
        }
    }

    #[test]
    fn an_answer_names_the_family_of_this_hosts_profile_only() {
        let mut claude = ProfileConfig::command("p", Vec::new());
        claude.kind = crate::config::ProfileKind::ClaudeCode;
        let profiles = [claude];
        let family_of = |slot: &SlotConfig| own_profile(&profiles, slot, "h").map(family);
        let mut here = slot("a");
        assert_eq!(family_of(&here), Some(Family::Known("anthropic")));
        here.host = Some("h".into());
        assert_eq!(family_of(&here), Some(Family::Known("anthropic")));
        // Another host's profile of the same name may run anything.
        here.host = Some("far".into());
        assert_eq!(family_of(&here), None);
        here.host = None;
        here.profile = "gone".into();
        assert_eq!(family_of(&here), None);
        // What another host named for its profile is that slot's family; a host not heard, or
        // one that named none, tells nothing.
        let far = HostView {
            host: "far".into(),
            status: "up".into(),
            profiles: vec!["p".into()],
            families: [("p".to_string(), "openai".to_string())].into(),
            last_seen_ms: Some(1),
        };
        let mut there = slot("b");
        there.host = Some("far".into());
        let own = own_profile(&profiles, &there, "h");
        assert_eq!(
            slot_family(&there, own, std::slice::from_ref(&far)).as_deref(),
            Some("openai")
        );
        assert_eq!(slot_family(&there, own, &[]), None);
        there.host = Some("elsewhere".into());
        assert_eq!(slot_family(&there, own, &[far]), None);
        // This host's own reading comes first.
        assert_eq!(
            slot_family(&slot("a"), profiles.first(), &[]).as_deref(),
            Some("anthropic")
        );
    }

    #[test]
    fn slots_are_chosen_in_configured_order_and_unknown_ones_refused() {
        let configured = [slot("a"), slot("b"), slot("c")];
        let names = |chosen: Vec<&SlotConfig>| -> Vec<String> {
            chosen.iter().map(|s| s.name.clone()).collect()
        };
        assert_eq!(names(chosen(&configured, None).unwrap()), ["a", "b", "c"]);
        let wanted = ["c".to_string(), "a".to_string()];
        assert_eq!(
            names(chosen(&configured, Some(&wanted)).unwrap()),
            ["a", "c"]
        );
        let err = chosen(&configured, Some(&["z\u{1b}".to_string()])).unwrap_err();
        assert!(
            err.message.contains(r"'z\u{1b}'") && err.message.contains("slots: a, b, c"),
            "{err}"
        );
        assert!(chosen(&configured, Some(&[])).is_err());
        let err = chosen(&[], None).unwrap_err();
        assert!(err.message.contains("[architects]"), "{err}");
    }
}
