"""The dashboard has no models of its own: the price roll-up it charts lives in the market app
(`controlplane.market.rollup`)."""
