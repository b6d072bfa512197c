use clap::{Parser, Subcommand};

/// Artemis Studio Operator: queues on every live node, safe connection closes, complete capture.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions (YAML) of every kind.
    Crd,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print!("{}", artemis_studio_operator::api::crds_yaml()?),
    }
    Ok(())
}
