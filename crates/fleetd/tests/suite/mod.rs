mod delivery;
