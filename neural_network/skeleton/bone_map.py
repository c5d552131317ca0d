"""Bone map: which bone of a user's armature plays each of the 23 roles. Pure Python, no bpy.

Why: every step after the map speaks roles, so the map is where any humanoid rig becomes usable. Known rigs are
recognised by name (presets); an unknown rig is read through its hierarchy: below the root hang two legs, a spine
up to a chest, and from the chest two arms and a neck up to the head. Twist, helper, finger, face and end bones
are skipped by name; left and right come from names where they say it, else from rest positions.

`auto_map` and `validate` never raise: whatever the input, they answer with a map and/or reasons in plain words.
"""

import re
from dataclasses import dataclass, field

from .roles import ESSENTIAL_ROLES, ROLE_PARENTS, ROLES


@dataclass
class MapResult:
    mapping: dict                       # role -> bone name, "" where the rig lacks the role
    preset: str                         # "demo", "mixamo", "cmu", "bandai", "rigify" or "heuristic"
    problems: list = field(default_factory=list)


def _sided(center, left, right):
    """Preset table from centre roles plus left-side names; `right` turns a left name into the right one."""
    table = dict(center)
    for role, name in left.items():
        table["Left" + role] = name
        table["Right" + role] = right(name)
    return table


_LIMBS = ("Shoulder", "Arm", "ForeArm", "Hand", "Thigh", "Shin", "Foot", "ToeBase")

PRESETS = {
    "demo": {role: role for role in ROLES},
    "mixamo": _sided(
        {"Hips": "mixamorig:Hips", "Spine": "mixamorig:Spine", "Spine1": "mixamorig:Spine1", "Spine2": "mixamorig:Spine2",
         "NeckLower": "mixamorig:Neck", "Head": "mixamorig:Head"},
        dict(zip(_LIMBS, ("mixamorig:LeftShoulder", "mixamorig:LeftArm", "mixamorig:LeftForeArm", "mixamorig:LeftHand",
                          "mixamorig:LeftUpLeg", "mixamorig:LeftLeg", "mixamorig:LeftFoot", "mixamorig:LeftToeBase"))),
        lambda n: n.replace("Left", "Right")),
    "cmu_bvh": _sided(
        {"Hips": "Hips", "Spine": "LowerBack", "Spine1": "Spine", "Spine2": "Spine1", "NeckLower": "Neck",
         "NeckUpper": "Neck1", "Head": "Head"},
        dict(zip(_LIMBS, ("LeftShoulder", "LeftArm", "LeftForeArm", "LeftHand", "LeftUpLeg", "LeftLeg", "LeftFoot",
                          "LeftToeBase"))),
        lambda n: n.replace("Left", "Right")),
    "cmu": _sided(
        {"Hips": "CC_Base_Hip", "Spine": "CC_Base_Waist", "Spine1": "CC_Base_Spine01", "Spine2": "CC_Base_Spine02",
         "NeckLower": "CC_Base_NeckTwist01", "NeckUpper": "CC_Base_NeckTwist02", "Head": "CC_Base_Head"},
        dict(zip(_LIMBS, ("CC_Base_L_Clavicle", "CC_Base_L_Upperarm", "CC_Base_L_Forearm", "CC_Base_L_Hand",
                          "CC_Base_L_Thigh", "CC_Base_L_Calf", "CC_Base_L_Foot", "CC_Base_L_ToeBase"))),
        lambda n: n.replace("_L_", "_R_")),
    "bandai": _sided(
        {"Hips": "Hips", "Spine": "Spine", "Spine1": "Chest", "NeckLower": "Neck", "Head": "Head"},
        dict(zip(_LIMBS, ("Shoulder_L", "UpperArm_L", "LowerArm_L", "Hand_L", "UpperLeg_L", "LowerLeg_L", "Foot_L",
                          "Toes_L"))),
        lambda n: n[:-2] + "_R"),
    "rigify": _sided(
        {"Hips": "DEF-spine", "Spine": "DEF-spine.001", "Spine1": "DEF-spine.002", "Spine2": "DEF-spine.003",
         "NeckLower": "DEF-spine.004", "NeckUpper": "DEF-spine.005", "Head": "DEF-spine.006"},
        dict(zip(_LIMBS, ("DEF-shoulder.L", "DEF-upper_arm.L", "DEF-forearm.L", "DEF-hand.L", "DEF-thigh.L",
                          "DEF-shin.L", "DEF-foot.L", "DEF-toe.L"))),
        lambda n: n[:-2] + ".R"),
}
PRESET_NAMES = tuple(PRESETS) + ("heuristic",)

# Name tokens of bones that never play a role: twist/helper/IK bones, fingers and toes, face, end sites.
_SKIP_TOKENS = {
    "twist", "helper", "share", "roll", "ik", "fk", "pole", "ctrl", "mch", "target", "corrective",
    "end", "nub", "tip", "site", "top",
    "thumb", "index", "middle", "mid", "ring", "pinky", "pinkie", "little", "finger", "fingers", "big",
    "eye", "eyes", "jaw", "tongue", "teeth", "lip", "lips", "brow", "cheek", "nose", "ear", "face", "facial",
    "breast", "ribs", "prop", "weapon",
}
_LEFT_TOKENS = {"left", "l", "lft", "lt"}
_RIGHT_TOKENS = {"right", "r", "rgt", "rt"}
_TOKEN_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def tokens(name):
    """Lower-case words of a bone name: 'CC_Base_L_MidToe1' -> ['cc', 'base', 'l', 'mid', 'toe', '1']."""
    return [t.lower() for t in _TOKEN_RE.findall(name)]


# What a bone's name says it is, for the limb roles: names win over the bone's place in its chain (a leg that starts
# with a short hip bone, hip > lButtock > lThigh, would otherwise map one bone off). "LegHelper" is a bone between
# the hips and a thigh (CMU's LHipJoint, DAZ's lButtock): it plays no role.
_LIMB_KINDS = ("Shoulder", "Arm", "ForeArm", "Hand", "Thigh", "Shin", "Foot", "ToeBase")


def name_kind(name):
    """The limb role a bone's name says ("Thigh", "Shin", "Foot", "ToeBase", "Shoulder", "Arm", "ForeArm", "Hand"),
    "LegHelper" for a hip bone before a thigh, or None when the name says none of them."""
    words = tokens(name)
    joined = "".join(words)
    has = set(words).__contains__
    sided = bool(set(words) & (_LEFT_TOKENS | _RIGHT_TOKENS))
    if any(w.startswith("toe") or w == "ball" for w in words):
        return "ToeBase"
    if has("foot") or has("ankle"):
        return "Foot"
    if has("thigh") or "upleg" in joined or "upperleg" in joined:
        return "Thigh"
    if has("shin") or has("calf") or has("knee") or "lowerleg" in joined or "lowleg" in joined or has("leg"):
        return "Shin"
    if has("buttock") or "hipjoint" in joined or (has("hip") and sided):
        return "LegHelper"
    if "forearm" in joined or "lowerarm" in joined or "lowarm" in joined or has("elbow"):
        return "ForeArm"
    if has("hand") or has("wrist"):
        return "Hand"
    if has("shldr") or "upperarm" in joined or "uparm" in joined or has("arm"):
        return "Arm"
    if has("shoulder") or has("clavicle") or has("collar"):
        return "Shoulder"
    return None


def _role_kind(role):
    """The limb kind of a role name ('LeftThigh' -> 'Thigh'), None for hips, spine, neck and head."""
    for side in ("Left", "Right"):
        if role.startswith(side) and role[len(side):] in _LIMB_KINDS:
            return role[len(side):]
    return None


def _skipped(name):
    """True for bones that never play a role (twist, helper, finger, face, end bones); 'bend' only without a limb
    word (DAZ's lShldrBend is the upper arm)."""
    words = set(tokens(name))
    return bool(words & _SKIP_TOKENS) or ("bend" in words and name_kind(name) is None)


def name_side(name):
    """+1 when a name says left, -1 when it says right, 0 when it says neither (or both)."""
    words = set(tokens(name))
    left, right = bool(words & _LEFT_TOKENS), bool(words & _RIGHT_TOKENS)
    return 1 if left and not right else -1 if right and not left else 0


# ---- input cleaning ----------------------------------------------------------------------------------------------

def _clean_bones(bones):
    """{name: parent or None} from any input: first entry of a name wins, unknown/self parents become None."""
    parents = {}
    try:
        items = list(bones)
    except Exception:
        return parents
    for item in items:
        if isinstance(item, str):
            name, parent = item, None       # a bare name: the caller gave no hierarchy
        else:
            try:
                name, parent = item[0], item[1]
            except Exception:
                continue
        if isinstance(name, str) and name and name not in parents:
            parents[name] = parent if isinstance(parent, str) else None
    for name, parent in parents.items():
        if parent == name or parent not in parents:
            parents[name] = None
    return parents


def _break_cycles(parents):
    """A forest: where walking up from a bone revisits a bone, that link is cut."""
    forest = dict(parents)
    settled = set()
    for start in forest:
        path, seen, node = [], set(), start
        while node is not None and node not in settled:
            if node in seen:
                forest[path[-1]] = None
                break
            seen.add(node)
            path.append(node)
            node = forest[node]
        settled.update(path)
    return forest


def _clean_positions(positions, names):
    """{name: (x, y, z)} from a dict or a list aligned with the bones; anything unreadable is dropped."""
    if positions is None:
        return {}
    out = {}
    try:
        pairs = positions.items() if hasattr(positions, "items") else zip(names, positions)
        for name, value in pairs:
            xyz = tuple(float(v) for v in value)
            if len(xyz) == 3 and all(v == v and abs(v) < 1e30 for v in xyz):
                out[name] = xyz
    except Exception:
        return out
    return out


def _is_ancestor(forest, ancestor, bone):
    """True when `ancestor` is a strict ancestor of `bone` (cycle-safe)."""
    seen = set()
    node = forest.get(bone)
    while node is not None and node not in seen:
        if node == ancestor:
            return True
        seen.add(node)
        node = forest.get(node)
    return False


# ---- validation --------------------------------------------------------------------------------------------------

def validate(mapping, bones):
    """Problems of a map for these bones, in plain words; an empty list means the map is usable.

    bones: [(name, parent or None)]; given bare names instead, the chain check is skipped (no hierarchy to check).
    """
    try:
        bones = list(bones) if isinstance(bones, (list, tuple)) or hasattr(bones, "__iter__") else []
        with_hierarchy = not any(isinstance(b, str) for b in bones)
        return _validate(mapping, _break_cycles(_clean_bones(bones)), with_hierarchy)
    except Exception as exc:    # never raise: a map checker that crashes helps nobody
        return [f"internal error while checking the bone map: {exc!r}"]


def _validate(mapping, forest, with_hierarchy=True):
    problems = []
    if not isinstance(mapping, dict):
        return ["The bone map is not a role -> bone table."] + [f"Missing essential role: {r}." for r in ESSENTIAL_ROLES]
    clean = {}
    for role, bone in mapping.items():
        if role not in ROLES:
            problems.append(f"Unknown role {role!r} ignored.")
        elif bone is None or bone == "":
            clean[role] = ""
        elif not isinstance(bone, str):
            problems.append(f"{role} is mapped to {bone!r}, which is not a bone name.")
            clean[role] = ""
        else:
            clean[role] = bone
    missing = [r for r in ESSENTIAL_ROLES if not clean.get(r)]
    if missing:
        problems.append(f"Missing essential role{'s' if len(missing) > 1 else ''}: {', '.join(missing)}.")
    for role in ROLES:
        bone = clean.get(role, "")
        if bone and bone not in forest:
            problems.append(f"{role} is mapped to '{bone}', which is not a bone of this armature.")
    users = {}
    for role in ROLES:
        if clean.get(role):
            users.setdefault(clean[role], []).append(role)
    for bone, roles in users.items():
        if len(roles) > 1:
            problems.append(f"Bone '{bone}' is used for more than one role: {', '.join(roles)}.")
    for j, role in enumerate(ROLES):
        bone = clean.get(role, "")
        if not with_hierarchy or not bone or bone not in forest:
            continue
        p = ROLE_PARENTS[j]
        while p >= 0 and not clean.get(ROLES[p]):
            p = ROLE_PARENTS[p]
        if p < 0:
            continue
        parent_bone = clean[ROLES[p]]
        if parent_bone in forest and parent_bone != bone and not _is_ancestor(forest, parent_bone, bone):
            problems.append(f"{role} ('{bone}') is outside its chain: it does not hang below {ROLES[p]} ('{parent_bone}').")
    problems.extend(_name_problems(clean))
    return problems


def _name_problems(mapping):
    """A role put on a bone whose name says another limb role, a hip bone, or the other side."""
    problems = []
    for role in ROLES:
        bone = mapping.get(role, "")
        want = _role_kind(role)
        if not bone or want is None:
            continue
        said = name_kind(bone)
        if said == "LegHelper":
            problems.append(f"{role} is mapped to '{bone}', whose name says a hip bone before the thigh.")
        elif said is not None and said != want:
            problems.append(f"{role} is mapped to '{bone}', whose name says {role[:-len(want)]}{said}.")
        side = name_side(bone)
        if side and side != (1 if role.startswith("Left") else -1):
            problems.append(f"{role} is mapped to '{bone}', whose name says the other side.")
    return problems


# ---- presets -----------------------------------------------------------------------------------------------------

def _strip_prefix(name):
    return name.rsplit(":", 1)[-1].lower()


def _match_preset(table, forest):
    """{role: actual bone} for the preset's bones found in the rig (exact name first, then prefix/case-free)."""
    loose = {}
    for name in forest:
        loose.setdefault(_strip_prefix(name), name)
    found = {}
    for role, wanted in table.items():
        if wanted in forest:
            found[role] = wanted
        elif _strip_prefix(wanted) in loose:
            found[role] = loose[_strip_prefix(wanted)]
    return found


def detect_preset(forest):
    """(preset name, {role: bone}) of the best preset that finds every essential role, or (None, {})."""
    best, best_found = None, {}
    for preset, table in PRESETS.items():
        found = _match_preset(table, forest)
        if all(role in found for role in ESSENTIAL_ROLES) and len(found) > len(best_found):
            best, best_found = preset, found
    return best, best_found


def preset_map(preset, bones):
    """Map a rig with a named preset (roles whose bone the rig lacks stay empty); problems say what is off."""
    try:
        forest = _break_cycles(_clean_bones(bones))
        if preset not in PRESETS:
            return MapResult({r: "" for r in ROLES}, str(preset), [f"Unknown preset {preset!r}."])
        found = _match_preset(PRESETS[preset], forest)
        mapping = {r: found.get(r, "") for r in ROLES}
        return MapResult(mapping, preset, _validate(mapping, forest))
    except Exception as exc:
        return MapResult({r: "" for r in ROLES}, str(preset), [f"internal error while applying the preset: {exc!r}"])


# ---- automatic mapping -------------------------------------------------------------------------------------------

def auto_map(bones, positions=None):
    """Detect the rig's preset or read its hierarchy; returns a full map (possibly partial) and any problems.

    bones: [(name, parent name or None)] in any order. positions: optional rest head positions (armature space,
    Z up) as {name: xyz} or a list aligned with bones; they settle left/right and head/arms when names do not.
    """
    try:
        forest = _break_cycles(_clean_bones(bones))
        if not forest:
            return MapResult({r: "" for r in ROLES}, "heuristic", ["The armature has no bones."])
        preset, found = detect_preset(forest)
        if preset is not None:
            mapping = {r: found.get(r, "") for r in ROLES}
            return MapResult(mapping, preset, _validate(mapping, forest))
        mapping, notes = _HierarchyReader(forest, _clean_positions(positions, list(forest))).read()
        full = {r: mapping.get(r, "") for r in ROLES}
        return MapResult(full, "heuristic", notes + _validate(full, forest))
    except Exception as exc:   # never raise; tests check this branch is never taken
        return MapResult({r: "" for r in ROLES}, "heuristic", [f"internal error while mapping: {exc!r}"])


class _HierarchyReader:
    """Reads an unknown rig: skips non-role bones, finds the five limb ends, and walks the chains between them."""

    def __init__(self, forest, positions):
        self.positions = positions
        skipped = {b for b in forest if _skipped(b)}
        self.parent = {}
        for bone in forest:
            if bone in skipped:
                continue
            node = forest[bone]
            while node is not None and node in skipped:
                node = forest[node]
            self.parent[bone] = node
        self.children = {b: [] for b in self.parent}
        for bone, parent in self.parent.items():
            if parent is not None:
                self.children[parent].append(bone)
        self.notes = []

    # tree helpers
    def _subtree(self, bone):
        out, stack = [], [bone]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(self.children[node])
        return out

    def _chain_length(self, bone):
        """Bones in the simple chain starting at `bone`, or None when it branches."""
        n, node = 0, bone
        while True:
            n += 1
            kids = self.children[node]
            if not kids:
                return n
            if len(kids) > 1:
                return None
            node = kids[0]

    def _ancestors(self, bone):
        out, node = [], bone
        while node is not None:
            out.append(node)
            node = self.parent[node]
        return out          # bone first, root last

    def _lca(self, bones):
        paths = [self._ancestors(b)[::-1] for b in bones]
        common = None
        for level in zip(*paths):
            if all(x == level[0] for x in level):
                common = level[0]
            else:
                break
        return common

    def _path(self, top, bone):
        """Bones strictly below `top` down to `bone` inclusive, top-down."""
        out = []
        for node in self._ancestors(bone):
            if node == top:
                return out[::-1]
            out.append(node)
        return out[::-1]

    def _z(self, bone):
        return self.positions[bone][2] if bone in self.positions else None

    def read(self):
        roots = [b for b, p in self.parent.items() if p is None]
        if not roots:
            return {}, ["No bone is left after skipping twist, helper, finger, face and end bones."]
        root = max(roots, key=lambda b: len(self._subtree(b)))
        body = self._subtree(root)
        hands = self._find_hands(body)
        removed = set()
        for hand in hands:
            removed.update(self._subtree(hand)[1:])
        leaves = [b for b in body if b not in removed and not [c for c in self.children[b] if c not in removed]]
        leaves = self._prune_leaves(leaves, removed)
        if len(leaves) < 5:
            return {}, [f"Found {len(leaves)} limb end(s) below '{root}' where two legs, two arms and a head are "
                        "expected; could not place any role from the hierarchy."]
        return self._assign(leaves, hands)

    def _find_hands(self, body):
        """Bones with four or more short unbranched children (fingers); the deepest such bones win."""
        hands = []
        for bone in body:
            kids = self.children[bone]
            if len(kids) >= 4 and all((self._chain_length(k) or 99) <= 4 for k in kids):
                hands.append(bone)
        return hands

    def _prune_leaves(self, leaves, removed):
        """Drop the shortest side stubs (props, extra helpers) until five limb ends remain."""
        leaves = list(leaves)
        limb_words = {"head", "hand", "wrist", "foot", "toe", "toes", "ankle", "ball"}
        while len(leaves) > 5:
            def stub(leaf):
                n, node = 0, leaf
                while self.parent[node] is not None:
                    kids = [c for c in self.children[self.parent[node]] if c not in removed]
                    n += 1
                    if len(kids) > 1:
                        break
                    node = self.parent[node]
                named = bool(set(tokens(leaf)) & limb_words)
                return (named, n, len(self._ancestors(leaf)), leaf)
            drop = min(leaves, key=stub)
            node = drop
            while node is not None:
                removed.add(node)
                parent = self.parent[node]
                if parent is None or [c for c in self.children[parent] if c not in removed]:
                    break
                node = parent
            leaves = [b for b in self._subtree(self._ancestors(drop)[-1])
                      if b not in removed and not [c for c in self.children[b] if c not in removed]]
        return leaves

    def _assign(self, leaves, hands):
        top = self._lca(leaves)
        groups = {}
        for leaf in leaves:
            path = self._path(top, leaf)
            groups.setdefault(path[0] if path else leaf, []).append(leaf)
        upper = [g for g in groups.values() if len(g) == 3]
        if len(upper) != 1 or len(leaves) != 5:
            return {}, [f"Could not find legs and a spine below '{top}': the limb ends split "
                        f"{sorted(len(g) for g in groups.values())} instead of 3 (spine) + 2 (legs)."]
        upper = upper[0]
        legs = [leaf for leaf in leaves if leaf not in upper]
        chest = self._lca(upper)
        head_leaf = self._pick_head(upper, chest, hands)
        if head_leaf is None:
            self.notes.append("Could not tell the head from the arms (no names or rest positions say it): "
                              "neck, head, shoulders and arms are left unmapped.")
        arms = [leaf for leaf in upper if leaf != head_leaf] if head_leaf else []
        mapping = {"Hips": top}
        spine = self._path(top, chest)
        if not spine:
            self.notes.append("The arms and the neck hang directly from the hips: no spine bone to map.")
        else:
            names = ("Spine",) if len(spine) == 1 else ("Spine", "Spine1") if len(spine) == 2 else ("Spine", "Spine1", "Spine2")
            picks = spine if len(spine) <= 3 else [spine[0], spine[(len(spine) - 1) // 2], spine[-1]]
            mapping.update(zip(names, picks))
        leg_top = self._lca(legs)
        leg_chains = [self._leg_chain(self._path(leg_top, leg)) for leg in legs]
        has_ends = any(ended for _, ended in leg_chains)
        for side, (chain, _) in zip(self._sides(legs, [c for c, _ in leg_chains]), leg_chains):
            chain = _named_chain(chain, ("Thigh", "Shin", "Foot"), "ToeBase") or chain
            if len(chain) < 3:
                self.notes.append(f"The {side.lower()} leg has only {len(chain)} bone(s); expected thigh, shin and foot.")
                continue
            mapping.update(zip((f"{side}Thigh", f"{side}Shin", f"{side}Foot", f"{side}ToeBase"), chain[:4]))
        head = self._path(chest, head_leaf) if head_leaf else []
        if has_ends and len(head) >= 3:
            head = head[:-1]
        if head:
            picks = head if len(head) <= 3 else [head[0], head[-2], head[-1]]
            names = {1: ("Head",), 2: ("NeckLower", "Head")}.get(len(picks), ("NeckLower", "NeckUpper", "Head"))
            mapping.update(zip(names, picks))
        arm_chains = []
        for leaf in arms:
            chain = self._path(chest, leaf)
            if leaf not in hands and has_ends and len(chain) >= 5:
                chain = chain[:-1]
            arm_chains.append(chain)
        for side, chain in zip(self._sides(arms, arm_chains), arm_chains):
            named = _named_chain(chain, ("Arm", "ForeArm", "Hand"), None, before="Shoulder")
            chain = named or chain
            if named is not None and named[0] is None:      # no bone before the arm: no shoulder role
                mapping.update(zip((f"{side}Arm", f"{side}ForeArm", f"{side}Hand"), chain[1:]))
                continue
            if len(chain) < 3:
                self.notes.append(f"The {side.lower()} arm has only {len(chain)} bone(s); expected arm, forearm and hand.")
                continue
            names = (f"{side}Arm", f"{side}ForeArm", f"{side}Hand")
            mapping.update(zip(names, chain[-3:]))
            if len(chain) >= 4:
                mapping[f"{side}Shoulder"] = chain[0]
        return mapping, self.notes

    def _pick_head(self, upper, chest, hands):
        named = [leaf for leaf in upper if any("head" in t or "neck" in t for b in self._path(chest, leaf) for t in tokens(b))]
        if len(named) == 1:
            return named[0]
        fingerless = [leaf for leaf in upper if leaf not in hands]
        if len(fingerless) == 1:        # two of the three ends carry fingers: those are the hands
            return fingerless[0]
        heights = [self._z(leaf) for leaf in upper]
        if all(h is not None for h in heights):
            return upper[max(range(3), key=lambda i: heights[i])]
        lengths = [len(self._path(chest, leaf)) for leaf in upper]
        odd = [leaf for leaf, n in zip(upper, lengths) if lengths.count(n) == 1]
        return odd[0] if len(odd) == 1 else None

    def _leg_chain(self, chain):
        """(thigh..toe chain, had an end bone): drops a hip helper at the top and an end bone at the bottom."""
        chain = list(chain)
        ended = False
        if len(chain) >= 5:
            pos = [self.positions.get(b) for b in chain[:3]]
            if all(p is not None for p in pos):
                helper = _dist(pos[0], pos[1]) < 0.5 * _dist(pos[1], pos[2])
                if helper:
                    chain = chain[1:]
            if len(chain) >= 5:
                chain, ended = chain[:-1], True
            if len(chain) >= 5:
                chain = chain[1:]
        return chain, ended

    def _sides(self, leaves, chains):
        """('Left', 'Right') ordered like `leaves`, from names, then rest positions, else a guess that is reported."""
        if len(leaves) != 2:
            return ()
        votes = [sum(name_side(b) for b in chain + [leaf]) for leaf, chain in zip(leaves, chains)]
        if votes[0] * votes[1] < 0:
            return ("Left", "Right") if votes[0] > 0 else ("Right", "Left")
        xs = [self._lateral(chain + [leaf]) for leaf, chain in zip(leaves, chains)]
        if all(x is not None for x in xs) and abs(xs[0] - xs[1]) > 1e-6:
            return ("Left", "Right") if xs[0] > xs[1] else ("Right", "Left")
        self.notes.append(f"Could not tell left from right for {', '.join(chains[0][-1:] + chains[1][-1:])}: "
                          "guessed from bone order; check the sides.")
        return ("Left", "Right")

    def _lateral(self, bones):
        """Mean sideways coordinate of bones, positive toward the character's left (facing -Y, Z up)."""
        pos = [self.positions[b] for b in bones if b in self.positions]
        if not pos:
            return None
        return sum(p[0] for p in pos) / len(pos)


def _named_chain(chain, kinds, after=None, before=None):
    """The bones of a limb chain whose names say `kinds` in order (e.g. thigh, shin, foot), or None when the names
    do not say all of them. With `after` (the toe): the leg chain [thigh, shin, foot] + [toe] when a bone below the
    foot is named a toe. With `before` (the shoulder): [shoulder or None, arm, forearm, hand], the shoulder being the
    bone just above the arm (named or not)."""
    found, start = [], 0
    for kind in kinds:
        index = next((i for i in range(start, len(chain)) if name_kind(chain[i]) == kind), None)
        if index is None:
            return None
        found.append(chain[index])
        start = index + 1
    if after is not None:
        toe = next((b for b in chain[start:] if name_kind(b) == after), None)
        return found + ([toe] if toe else [])
    if before is not None:
        first = chain.index(found[0])
        return [chain[first - 1] if first > 0 else None] + found
    return found


def _dist(a, b):
    return sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
