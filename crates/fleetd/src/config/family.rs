//! Which model family a profile's agent runs: the architects a lead consults are there to bring
//! two families to one brief (DESIGN §1), since two models of one maker agreeing is weaker
//! evidence than two makers' agreeing.
//!
//! A family is named by its maker, as a lowercase id (`anthropic`, `openai`, `google`,
//! `mistral`, `meta`, `deepseek`, `alibaba`, `xai`, `microsoft`, `amazon`, `cohere`,
//! `moonshot`, `zhipu`, `minimax`, `baidu`). fleetd tells it, in this order:
//!
//! 1. from the model's own name (its last `/` segment): the first of its words (split at `-`,
//!    `_`, `.`, `:`, `@`) that names a model line (`claude`, `sonnet`, `gpt`, `o3`, `gemini`,
//!    `llama`, `qwen`, `grok` …, alone or followed by its version: `llama3`, `gpt4o`) or a
//!    maker (Bedrock's `anthropic.claude-…`). Whatever serves it (a `base_url` proxy speaks
//!    any API), a model is of the family its name says;
//! 2. else from the provider it is taken from, when that provider is one maker: opencode's
//!    `provider/` prefix (the segment nearest the model first), Claude Code's Anthropic. A
//!    model name fleetd does not know under such a provider is that maker's; a host of many
//!    families (`openrouter`, `amazon-bedrock`, `azure`, `groq`, `ollama` …) says nothing;
//! 3. else it is unknown, and told apart by what the profile runs ([`model_identity`]): an
//!    opencode profile with no `model` runs the user's default model, a command profile a
//!    program fleetd cannot see into. Two unknowns are one family only if they run the same.

use super::{ProfileConfig, ProfileKind};

/// Model lines and makers, as words of a model's name, and the family each names.
const WORDS: &[(&str, &str)] = &[
    ("claude", "anthropic"),
    ("sonnet", "anthropic"),
    ("opus", "anthropic"),
    ("haiku", "anthropic"),
    ("anthropic", "anthropic"),
    ("gpt", "openai"),
    ("chatgpt", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("codex", "openai"),
    ("openai", "openai"),
    ("gemini", "google"),
    ("gemma", "google"),
    ("google", "google"),
    ("mistral", "mistral"),
    ("mistralai", "mistral"),
    ("mixtral", "mistral"),
    ("codestral", "mistral"),
    ("ministral", "mistral"),
    ("magistral", "mistral"),
    ("devstral", "mistral"),
    ("pixtral", "mistral"),
    ("llama", "meta"),
    ("codellama", "meta"),
    ("meta", "meta"),
    ("deepseek", "deepseek"),
    ("qwen", "alibaba"),
    ("qwq", "alibaba"),
    ("alibaba", "alibaba"),
    ("grok", "xai"),
    ("xai", "xai"),
    ("phi", "microsoft"),
    ("microsoft", "microsoft"),
    ("nova", "amazon"),
    ("titan", "amazon"),
    ("amazon", "amazon"),
    ("cohere", "cohere"),
    ("kimi", "moonshot"),
    ("moonshot", "moonshot"),
    ("moonshotai", "moonshot"),
    ("glm", "zhipu"),
    ("chatglm", "zhipu"),
    ("zhipu", "zhipu"),
    ("zhipuai", "zhipu"),
    ("minimax", "minimax"),
    ("abab", "minimax"),
    ("ernie", "baidu"),
    ("baidu", "baidu"),
];

/// Providers (opencode's `provider/` prefix, whole) that serve one maker's models only.
const PROVIDERS: &[(&str, &str)] = &[
    ("anthropic", "anthropic"),
    ("openai", "openai"),
    ("google", "google"),
    ("mistral", "mistral"),
    ("mistralai", "mistral"),
    ("meta", "meta"),
    ("meta-llama", "meta"),
    ("deepseek", "deepseek"),
    ("alibaba", "alibaba"),
    ("qwen", "alibaba"),
    ("xai", "xai"),
    ("x-ai", "xai"),
    ("cohere", "cohere"),
    ("moonshotai", "moonshot"),
    ("zhipuai", "zhipu"),
    ("z-ai", "zhipu"),
    ("zai", "zhipu"),
    ("minimax", "minimax"),
];

/// A profile's model family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Family {
    /// A maker's family, by its lowercase id (`anthropic`, `openai` …).
    Known(&'static str),
    /// One fleetd cannot name, told apart by what the profile runs (see [`model_identity`]).
    Unknown(String),
}

impl Family {
    /// The family's id, when fleetd can name it.
    pub fn id(&self) -> Option<&'static str> {
        match self {
            Family::Known(id) => Some(id),
            Family::Unknown(_) => None,
        }
    }
}

/// What tells two models apart: the profile's `model` (its last path segment, case aside:
/// `anthropic/claude-x` and `claude-x` are one model), else the default of its kind of agent,
/// else (a program fleetd cannot see into) the profile itself.
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

/// The family of each of `profiles` whose family can be named, by profile: what a host tells
/// the others of its profiles, and shows in its host entry.
pub fn families(profiles: &[ProfileConfig]) -> std::collections::BTreeMap<String, String> {
    profiles
        .iter()
        .filter_map(|p| Some((p.name.clone(), family(p).id()?.to_string())))
        .collect()
}

/// The family `profile`'s agent runs (the rule is the module's).
pub fn family(profile: &ProfileConfig) -> Family {
    match family_of(profile.agent_kind(), profile.model.as_deref()) {
        Some(id) => Family::Known(id),
        None => Family::Unknown(model_identity(profile)),
    }
}

/// The family of `model` run by an agent of kind `agent`, if fleetd can name it.
fn family_of(agent: ProfileKind, model: Option<&str>) -> Option<&'static str> {
    let model = model.map(str::to_ascii_lowercase);
    let mut segments = model.as_deref().unwrap_or_default().rsplit('/');
    let name = segments.next().unwrap_or_default();
    // Claude Code speaks to Anthropic's API (or to what stands in for it).
    let provider = (agent == ProfileKind::ClaudeCode).then_some("anthropic");
    name.split(['-', '_', '.', ':', '@'])
        .find_map(line_of)
        .or_else(|| {
            segments.find_map(|segment| {
                PROVIDERS
                    .iter()
                    .find(|(p, _)| *p == segment)
                    .map(|(_, family)| *family)
            })
        })
        .or(provider)
}

/// The family `word` (lowercase) names: a model line or maker alone, or followed by a version
/// (`llama3`, `qwen2`, `gpt4o`).
fn line_of(word: &str) -> Option<&'static str> {
    WORDS.iter().find_map(|(line, family)| {
        let rest = word.strip_prefix(line)?;
        (rest.is_empty() || rest.starts_with(|c: char| c.is_ascii_digit())).then_some(*family)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_of_the_family_its_name_says() {
        for (model, family) in [
            ("claude-sonnet-4-5", "anthropic"),
            ("Claude-Opus-4-1", "anthropic"),
            ("sonnet", "anthropic"),
            ("anthropic/claude-haiku-4-5", "anthropic"),
            ("claude-sonnet-4@20250514", "anthropic"),
            ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", "anthropic"),
            ("openai/gpt-5.6", "openai"),
            ("GPT-4o", "openai"),
            ("gpt4o-mini", "openai"),
            ("o3", "openai"),
            ("o4-mini", "openai"),
            ("ollama/gpt-oss:20b", "openai"),
            ("google/gemini-2.5-pro", "google"),
            ("gemma3:27b", "google"),
            ("mistral/codestral-latest", "mistral"),
            ("mistral-large-latest", "mistral"),
            ("llama3.1:8b", "meta"),
            ("openrouter/meta-llama/llama-3.3-70b-instruct", "meta"),
            ("deepseek/deepseek-chat", "deepseek"),
            ("qwen2.5-coder:7b", "alibaba"),
            ("xai/grok-4", "xai"),
            ("openrouter/moonshotai/kimi-k2", "moonshot"),
            ("z-ai/glm-4.5", "zhipu"),
            ("phi3:mini", "microsoft"),
            ("amazon.nova-pro-v1:0", "amazon"),
        ] {
            assert_eq!(
                family_of(ProfileKind::Opencode, Some(model)),
                Some(family),
                "{model}"
            );
        }
        // The name decides over the provider that serves it: a proxy may speak any API.
        assert_eq!(
            family_of(ProfileKind::ClaudeCode, Some("gpt-5.6")),
            Some("openai")
        );
        assert_eq!(
            family_of(ProfileKind::Opencode, Some("anthropic/gpt-5.6")),
            Some("openai")
        );
        // A word only counts whole or with its version: not inside another word.
        assert_eq!(family_of(ProfileKind::Opencode, Some("x/ophelia")), None);
        assert_eq!(family_of(ProfileKind::Opencode, Some("x/supernova")), None);
    }

    #[test]
    fn an_unknown_name_is_its_providers_and_a_host_of_many_says_nothing() {
        for (agent, model, family) in [
            (
                ProfileKind::Opencode,
                Some("openai/my-finetune"),
                Some("openai"),
            ),
            (
                ProfileKind::Opencode,
                Some("anthropic/house-model"),
                Some("anthropic"),
            ),
            (
                ProfileKind::Opencode,
                Some("openrouter/x-ai/new-one"),
                Some("xai"),
            ),
            (ProfileKind::Opencode, Some("openrouter/house-model"), None),
            (
                ProfileKind::Opencode,
                Some("amazon-bedrock/house-model"),
                None,
            ),
            (ProfileKind::Opencode, Some("groq/house-model"), None),
            (ProfileKind::Opencode, None, None),
            // Claude Code runs Anthropic's models, unless its model's name says otherwise.
            (ProfileKind::ClaudeCode, None, Some("anthropic")),
            (
                ProfileKind::ClaudeCode,
                Some("house-model"),
                Some("anthropic"),
            ),
            (ProfileKind::Command, None, None),
        ] {
            assert_eq!(family_of(agent, model), family, "{agent:?} {model:?}");
        }
    }

    #[test]
    fn models_are_told_apart_by_name_then_by_kind_then_by_profile() {
        let mut claude = ProfileConfig::command("c", Vec::new());
        claude.kind = ProfileKind::ClaudeCode;
        let mut sonnet = claude.clone();
        sonnet.model = Some("Claude-Sonnet-5".into());
        let mut proxied = sonnet.clone();
        proxied.kind = ProfileKind::Opencode;
        proxied.model = Some("anthropic/claude-sonnet-5".into());
        let cmd = ProfileConfig::command("x", vec!["prog".into()]);
        assert_eq!(model_identity(&claude), "the default model of claude-code");
        assert_eq!(model_identity(&sonnet), "model 'claude-sonnet-5'");
        assert_eq!(model_identity(&sonnet), model_identity(&proxied));
        assert_eq!(model_identity(&cmd), "the program of profile 'x'");
    }

    #[test]
    fn a_profile_fleetd_cannot_see_into_is_a_family_of_what_it_runs() {
        let mut claude = ProfileConfig::command("c", vec!["claude".into()]);
        claude.kind = ProfileKind::ClaudeCode;
        assert_eq!(family(&claude), Family::Known("anthropic"));
        assert_eq!(family(&claude).id(), Some("anthropic"));
        let mut sandboxed = ProfileConfig::command("s", Vec::new());
        sandboxed.kind = ProfileKind::Sandbox;
        sandboxed.agent_kind = Some(ProfileKind::Opencode);
        sandboxed.model = Some("openai/gpt-5.6".into());
        assert_eq!(family(&sandboxed), Family::Known("openai"));
        let mut opencode = ProfileConfig::command("o", Vec::new());
        opencode.kind = ProfileKind::Opencode;
        assert_eq!(
            family(&opencode),
            Family::Unknown("the default model of opencode".into())
        );
        assert_eq!(family(&opencode).id(), None);
        let program = ProfileConfig::command("x", vec!["prog".into()]);
        assert_eq!(
            family(&program),
            Family::Unknown("the program of profile 'x'".into())
        );
        let mut unnamed = ProfileConfig::command("u", Vec::new());
        unnamed.kind = ProfileKind::Opencode;
        unnamed.model = Some("openrouter/House-Model".into());
        assert_eq!(
            family(&unnamed),
            Family::Unknown("model 'house-model'".into())
        );
    }
}
