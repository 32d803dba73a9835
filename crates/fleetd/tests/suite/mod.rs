mod auth;
mod badinput;
mod cli;
mod delivery;
mod durability;
mod lifecycle;
mod nudge;
mod python;
