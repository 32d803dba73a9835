//! Showing what carries secrets without the secrets. A worker's environment holds its bearer
//! token (`FLEET_TOKEN`) and often an API key; a sandbox runtime's argv may hold the token too
//! (`{token}`). `Debug` of such a struct ends up in logs and errors (`tracing::debug!(?spec)`),
//! so those structs write their `Debug` by hand through these wrappers: names and shapes show,
//! values never do.

use std::collections::BTreeMap;
use std::fmt;

/// What stands in for a hidden value.
pub const MASK: &str = "***";

/// An environment as its names, every value masked: `{"FLEET_TOKEN": ***}`.
pub struct EnvNames<'a>(pub &'a BTreeMap<String, String>);

impl fmt::Debug for EnvNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|key| (key, Masked)))
            .finish()
    }
}

/// An argv as its program and how many arguments follow: `["docker", …3 more]`.
pub struct ProgramOnly<'a>(pub &'a [String]);

impl fmt::Debug for ProgramOnly<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        if let Some((program, args)) = self.0.split_first() {
            list.entry(program);
            if !args.is_empty() {
                list.entry(&format_args!("…{} more", args.len()));
            }
        }
        list.finish()
    }
}

/// A value that is there but not shown.
struct Masked;

impl fmt::Debug for Masked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_programs_show_and_values_never_do() {
        let env = BTreeMap::from([
            ("FLEET_TOKEN".to_string(), "fleet_0123secret".to_string()),
            ("HOME".to_string(), "/home/me".to_string()),
        ]);
        assert_eq!(
            format!("{:?}", EnvNames(&env)),
            r#"{"FLEET_TOKEN": ***, "HOME": ***}"#
        );
        let argv: Vec<String> = ["docker", "run", "-e", "FLEET_TOKEN=fleet_0123secret"]
            .map(String::from)
            .into();
        assert_eq!(
            format!("{:?}", ProgramOnly(&argv)),
            r#"["docker", …3 more]"#
        );
        assert_eq!(format!("{:?}", ProgramOnly(&argv[..1])), r#"["docker"]"#);
        assert_eq!(format!("{:?}", ProgramOnly(&[])), "[]");
        // The pretty form ({:#?}) hides them as well.
        assert!(!format!("{:#?}", EnvNames(&env)).contains("secret"));
    }
}
