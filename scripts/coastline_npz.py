"""Build pipeline/products/geo/coastline_110m.npz from Natural Earth's 1:110m land (public domain) as the npm
package world-atlas 2.0.2 ships it (land-110m.json, TopoJSON; `npm pack world-atlas@2.0.2`).

Usage: python scripts/coastline_npz.py PATH/TO/land-110m.json pipeline/products/geo/coastline_110m.npz

The land outline's arcs, decoded (delta-encoded, quantised) to degrees, as one (N, 2) float32 array of
(longitude, latitude) with a NaN row between lines; the edges the polygons have only to close the map
(along 180 deg and along Antarctica's southern edge) are not coastline and are dropped."""

from __future__ import annotations

import json
import sys

import numpy as np


def decode(topo: dict) -> list[np.ndarray]:
    """Each arc of ``topo`` as (n, 2) degrees."""
    scale, shift = np.array(topo["transform"]["scale"]), np.array(topo["transform"]["translate"])
    return [np.cumsum(np.array(a, dtype=np.float64), axis=0) * scale + shift for a in topo["arcs"]]


def coast_pieces(arc: np.ndarray, south: float) -> list[np.ndarray]:
    """``arc`` cut where a segment runs along the map's edge (|lon| = 180 or the southern edge)."""
    edge = (np.abs(arc[:, 0]) >= 180.0 - 1e-6) | (arc[:, 1] <= south + 1e-6)
    along = edge[1:] & edge[:-1]  # a segment with both ends on the edge
    pieces, start = [], 0
    for k in np.flatnonzero(along):
        pieces.append(arc[start : k + 1])
        start = k + 1
    pieces.append(arc[start:])
    return [p for p in pieces if len(p) > 1]


def main(src: str, dst: str) -> None:
    with open(src) as fh:
        topo = json.load(fh)
    south = float(topo["bbox"][1])
    lines = [p for arc in decode(topo) for p in coast_pieces(arc, south)]
    gap = np.full((1, 2), np.nan)
    out = np.concatenate([x for line in lines for x in (line, gap)])[:-1].astype(np.float32)
    np.savez_compressed(
        dst, lonlat=out, source=np.array("Natural Earth 1:110m land (public domain), world-atlas 2.0.2")
    )
    print(f"{len(lines)} lines, {len(out)} rows -> {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
