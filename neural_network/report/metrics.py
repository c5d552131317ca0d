"""How far a solved motion is from the reference it was solved from: the figures that compare IK solvers.

Every metric compares a solved motion with its reference frame by frame, so a reference measured against itself
scores exactly 0 everywhere (the harness test relies on it). Quantities that real motion has on its own (feet that
slide a little while planted, joint acceleration, rotations beyond the learned limits) are reported as the solved
motion's excess over the reference's.

Inputs are character-space arrays in metres: positions (N, 23, 3) role heads, rotations (N, 23, 3, 3) role
orientations; results are in centimetres and degrees. `actions` (N,) splits the frames into clips so that frame
differences never cross a clip boundary.
"""

from dataclasses import dataclass

import numpy as np

from ..data.features import detect_contacts
from ..geometry.rotations import angle_between, matrix_to_axis_angle
from ..skeleton.roles import EFFECTOR_ROLES, EFFECTORS, FOOT_ROLES, INNER_ROLES, ROLE_INDEX, ROLES, TASKS

CM = 100.0
_TOES = (ROLE_INDEX["LeftToeBase"], ROLE_INDEX["RightToeBase"])


@dataclass
class Motion:
    """A clip set in character space (metres); local rotations (Blender's matrix_basis) only for joint limits."""
    positions: np.ndarray            # (N, 23, 3)
    rotations: np.ndarray            # (N, 23, 3, 3)
    local_rotations: np.ndarray = None   # (N, 23, 3, 3) or None


def summary(values):
    """{"mean", "p95", "max"} of an array, ignoring NaN; zeros for an empty one."""
    v = np.asarray(values, np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"mean": 0.0, "p95": 0.0, "max": 0.0}
    return {"mean": float(v.mean()), "p95": float(np.percentile(v, 95)), "max": float(v.max())}


def joint_errors(reference, solved, role_mask):
    """(N, 23) distance per role in cm, NaN where the rig lacks the role."""
    err = np.linalg.norm(np.asarray(solved.positions, np.float64) - np.asarray(reference.positions, np.float64), axis=-1)
    err = err * CM
    err[:, ~np.asarray(role_mask, bool)] = np.nan
    return err


def effector_position_errors(reference, solved):
    """(N, 5) distance of each effector (roles.EFFECTORS) from the reference, cm."""
    idx = list(EFFECTOR_ROLES)
    diff = np.asarray(solved.positions, np.float64)[:, idx] - np.asarray(reference.positions, np.float64)[:, idx]
    return np.linalg.norm(diff, axis=-1) * CM


def effector_rotation_errors(reference, solved):
    """(N, 5) geodesic angle between each effector's solved and reference orientation, degrees (float64, atan2)."""
    idx = list(EFFECTOR_ROLES)
    return np.degrees(angle_between(np.asarray(reference.rotations)[:, idx], np.asarray(solved.rotations)[:, idx]))


def clip_bounds(actions):
    """(start, end) index pairs of consecutive runs of equal action index."""
    actions = np.asarray(actions)
    if actions.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(actions)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(actions)]])
    return list(zip(starts.tolist(), ends.tolist()))


def contact_flags(reference, actions, fps, rig_height):
    """(N, 2) feet in contact in the reference (features.detect_contacts per clip, ground at the clip's lowest)."""
    pos = np.asarray(reference.positions, np.float64)
    out = np.zeros((len(pos), 2), np.float32)
    for s, e in clip_bounds(actions):
        feet = pos[s:e][:, list(FOOT_ROLES)]
        ground = np.min(feet[..., 2], axis=0)
        out[s:e] = detect_contacts(feet, ground[None], fps, rig_height)
    return out


def foot_slide(motion, contacts, actions):
    """(N, 2) horizontal distance each foot moved since the previous frame (cm) where it is in contact in this
    frame and the previous one of the same clip; NaN elsewhere."""
    pos = np.asarray(motion.positions, np.float64)[:, list(FOOT_ROLES), :2]
    out = np.full((len(pos), 2), np.nan)
    for s, e in clip_bounds(actions):
        if e - s < 2:
            continue
        step = np.linalg.norm(np.diff(pos[s:e], axis=0), axis=-1) * CM
        both = (contacts[s + 1:e] > 0.5) & (contacts[s:e - 1] > 0.5)
        out[s + 1:e] = np.where(both, step, np.nan)
    return out


def penetration(reference, solved, actions):
    """(N, 4) depth of feet and toes below the ground (cm), the ground of a clip being the reference's lowest
    height of that joint in the clip, so the reference itself never penetrates."""
    joints = list(FOOT_ROLES) + list(_TOES)
    ref = np.asarray(reference.positions, np.float64)[:, joints, 2]
    sol = np.asarray(solved.positions, np.float64)[:, joints, 2]
    out = np.zeros(ref.shape)
    for s, e in clip_bounds(actions):
        seen = np.isfinite(ref[s:e])
        # a joint the rig lacks (a foot without toe bone) is NaN throughout: ground +inf, no depth (no warning)
        ground = np.min(np.where(seen, ref[s:e], np.inf), axis=0)
        out[s:e] = np.maximum(ground - sol[s:e], 0.0) * CM
    return np.nan_to_num(out, posinf=0.0)


def joint_acceleration(motion, role_mask, actions):
    """(N, 23) magnitude of the second difference of each joint (cm/frame^2); NaN at clip ends and unmapped roles."""
    pos = np.asarray(motion.positions, np.float64)
    out = np.full(pos.shape[:2], np.nan)
    for s, e in clip_bounds(actions):
        if e - s < 3:
            continue
        acc = pos[s + 2:e] - 2.0 * pos[s + 1:e - 1] + pos[s:e - 2]
        out[s + 1:e - 1] = np.linalg.norm(acc, axis=-1) * CM
    out[:, ~np.asarray(role_mask, bool)] = np.nan
    return out


def limit_excess(local_rotations, mean_pose, limit_low, limit_high):
    """(N, 23, 3) degrees by which each axis-angle delta from the mean pose lies outside [low, high] (0 inside)."""
    delta = matrix_to_axis_angle(np.swapaxes(np.asarray(mean_pose, np.float64), -1, -2)[None]
                                 @ np.asarray(local_rotations, np.float64))
    beyond = np.maximum(delta - np.asarray(limit_high, np.float64), np.asarray(limit_low, np.float64) - delta)
    return np.degrees(np.maximum(beyond, 0.0))


def _nanmean(values):
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else 0.0


def frame_metrics(reference, solved, role_mask):
    """Per-frame arrays the summaries and plots are built from."""
    mask = np.asarray(role_mask, bool)
    joints = joint_errors(reference, solved, mask)
    inner = [j for j in INNER_ROLES if mask[j]]
    return {
        "joints_cm": joints,
        "effector_cm": effector_position_errors(reference, solved),
        "effector_deg": effector_rotation_errors(reference, solved),
        "mpjpe_cm": np.nanmean(joints[:, mask], axis=1),
        "inner_cm": np.nanmean(joints[:, inner], axis=1) if inner else np.zeros(len(joints)),
    }


def summarize(frames, reference, solved, role_mask, actions, contacts, limits=None, select=None):
    """Summary of the frames in `select` (a boolean (N,) array; all frames when None)."""
    n = len(frames["mpjpe_cm"])
    sel = np.ones(n, bool) if select is None else np.asarray(select, bool)
    mask = np.asarray(role_mask, bool)
    eff_cm, eff_deg, joints = frames["effector_cm"][sel], frames["effector_deg"][sel], frames["joints_cm"][sel]
    out = {
        "frames": int(sel.sum()),
        "effector_cm": summary(eff_cm),
        "effector_deg": summary(eff_deg),
        "effector_miss_1cm": float(np.mean(np.max(eff_cm, axis=1) > 1.0)) if len(eff_cm) else 0.0,
        "mpjpe_cm": _nanmean(frames["mpjpe_cm"][sel]),
        "inner_mpjpe_cm": _nanmean(frames["inner_cm"][sel]),
        "per_role_cm": {ROLES[j]: _nanmean(joints[:, j]) for j in range(len(ROLES)) if mask[j]},
        "per_effector_cm": {name: _nanmean(eff_cm[:, k]) for k, name in enumerate(EFFECTORS)},
        "per_effector_p95_cm": {name: summary(eff_cm[:, k])["p95"] for k, name in enumerate(EFFECTORS)},
        "per_effector_deg": {name: _nanmean(eff_deg[:, k]) for k, name in enumerate(EFFECTORS)},
    }
    slide_sol = foot_slide(solved, contacts, actions)[sel]
    slide_ref = foot_slide(reference, contacts, actions)[sel]
    out["foot_skating_cm"] = _nanmean(slide_sol)
    out["foot_skating_reference_cm"] = _nanmean(slide_ref)
    out["foot_skating_excess_cm"] = _nanmean(slide_sol - slide_ref)
    depth = penetration(reference, solved, actions)[sel]
    out["penetration_cm"] = {"mean": float(depth.mean()) if depth.size else 0.0,
                             "max": float(depth.max()) if depth.size else 0.0}
    acc_sol = joint_acceleration(solved, mask, actions)[sel]
    acc_ref = joint_acceleration(reference, mask, actions)[sel]
    out["jitter_cm"] = _nanmean(acc_sol - acc_ref)
    out["acceleration_cm"] = _nanmean(acc_sol)
    out["acceleration_reference_cm"] = _nanmean(acc_ref)
    if limits is not None and solved.local_rotations is not None and reference.local_rotations is not None:
        mean_pose, low, high = limits
        extra = limit_excess(solved.local_rotations[sel], mean_pose, low, high)
        extra = np.maximum(extra - limit_excess(reference.local_rotations[sel], mean_pose, low, high), 0.0)
        extra[:, ~mask] = 0.0
        extra[:, ROLE_INDEX["Hips"]] = 0.0
        hit = extra > 1e-3
        out["limit_violations"] = {"count": int(hit.sum()), "mean_deg": float(extra[hit].mean()) if hit.any() else 0.0,
                                   "max_deg": float(extra.max()) if extra.size else 0.0}
        out["limit_violations_per_role"] = {ROLES[j]: int(hit[:, j].sum()) for j in range(len(ROLES)) if hit[:, j].any()}
    return out


def evaluate(reference, solved, role_mask, actions, fps, rig_height, tasks=None, action_names=None, limits=None):
    """Every metric of `solved` against `reference`, overall, per action and per task.

    actions (N,) action index per frame; tasks (N,) task index per frame (roles.TASKS); action_names list;
    limits (mean_pose (23,3,3), low (23,3), high (23,3)) for joint-limit violations, or None.
    Returns (result dict, per-frame arrays).
    """
    actions = np.asarray(actions)
    frames = frame_metrics(reference, solved, role_mask)
    contacts = contact_flags(reference, actions, fps, rig_height)
    result = summarize(frames, reference, solved, role_mask, actions, contacts, limits)
    per_action = {}
    for a in np.unique(actions):
        name = action_names[a] if action_names is not None else str(int(a))
        per_action[name] = summarize(frames, reference, solved, role_mask, actions, contacts, limits, actions == a)
    result["per_action"] = per_action
    if tasks is not None:
        tasks = np.asarray(tasks)
        result["per_task"] = {TASKS[t]: summarize(frames, reference, solved, role_mask, actions, contacts, limits,
                                                  tasks == t) for t in np.unique(tasks)}
    return result, frames
