//! Running fleetd as a service: it tells a service manager (`NOTIFY_SOCKET`) when it serves and
//! when it stops, and the systemd unit in `contrib/` is one systemd accepts.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use fleet_testkit::bins::binary;
use fleet_testkit::fleet::Fleet;
use fleetd::launch::locate_program;

/// The next datagram on `socket`, waiting up to 30 s.
async fn next_datagram(socket: &UnixDatagram) -> anyhow::Result<String> {
    let socket = socket.try_clone()?;
    tokio::task::spawn_blocking(move || {
        socket.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buffer = [0u8; 4096];
        let n = socket.recv(&mut buffer)?;
        Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_manager_hears_when_fleetd_serves_and_when_it_stops() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path)?;
    let notify = path.to_str().map(String::from);
    let mut fleet = Fleet::start_with_env(
        &std::env::temp_dir(),
        "",
        "",
        &[("NOTIFY_SOCKET", notify.as_deref())],
    )
    .await?;
    let ready = next_datagram(&socket).await?;
    let pid = fleet.pid().unwrap_or_default();
    assert!(
        ready.starts_with("READY=1\n") && ready.contains(&format!("MAINPID={pid}\n")),
        "{ready}"
    );
    assert!(fleet.terminate().await?, "fleetd did not stop cleanly");
    let stopping = next_datagram(&socket).await?;
    assert!(stopping.starts_with("STOPPING=1\n"), "{stopping}");
    Ok(())
}

#[test]
fn the_systemd_unit_is_one_systemd_accepts() -> anyhow::Result<()> {
    let path = std::env::var_os("PATH");
    let Some(analyze) = locate_program("systemd-analyze", path.as_deref(), Path::new("/")) else {
        anyhow::bail!(
            "systemd-analyze is not installed, so the unit cannot be checked (./test.sh installs it: apt-get install systemd)"
        );
    };
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/fleetd.service");
    let text = std::fs::read_to_string(&unit)?;
    assert!(text.contains("Type=notify") && text.contains("Restart=on-failure"));
    // The unit as installed for this build: its fleetd where this build put it.
    let fleetd = binary("fleetd")?;
    let dir = tempfile::tempdir()?;
    let installed = dir.path().join("fleetd.service");
    let exec = text
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .ok_or_else(|| anyhow::anyhow!("no ExecStart"))?;
    let args: Vec<&str> = exec.trim_start_matches("ExecStart=").split(' ').collect();
    assert_eq!(args[1..], ["serve"], "{exec}");
    std::fs::write(
        &installed,
        text.replace(args[0], &fleetd.display().to_string()),
    )?;
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&installed)
        .output()?;
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
