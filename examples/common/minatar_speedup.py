"""MinAtar's SpaceInvaders, the same game step for step, on bitboards; and Freeway's frames
written in one numpy call.

MinAtar's SpaceInvaders keeps its grids as 10x10 numpy arrays and steps them with a dozen numpy
calls (rolls, sums, masks), each costing more in numpy's Python-level overhead than in work: its
env worker was the busiest of the five games' (docs/results.md). Here the three grids are Python
integers, one bit a cell, and a step is a few shifts and masks: 4x less CPU time per step. The
rules, their order, the observations, rewards and ends are MinAtar's;
tests/unit/test_minatar_speedup.py steps both from thousands of random states and replays seeded
games both ways. ``install()`` makes it the class MinAtar's ``Environment`` builds for
SpaceInvaders (MinAtar looks the class up in its game module when an env is made), and
``OneCallFreeway`` the one it builds for Freeway.

Importing this module imports minatar (and its plotting libraries): envs.py does so only when
it makes a MinAtar env.
"""

import numpy as np
from minatar.environments import freeway, space_invaders

# SpaceInvaders' grids as 100-bit integers: bit 10 * row + column is cell (row, column).
_FULL = (1 << 100) - 1
_COLUMNS = [sum(1 << (10 * row + column) for row in range(10)) for column in range(10)]
_BOTTOM_ROW = ((1 << 10) - 1) << 90
_WAVE = sum(1 << (10 * row + column) for row in range(4) for column in range(2, 8))


def _grid(bits):
    """A 100-bit grid as MinAtar keeps it: a 10x10 float array of 0 and 1."""
    cells = np.frombuffer(bits.to_bytes(13, "little"), np.uint8)
    return np.unpackbits(cells, count=100, bitorder="little").reshape(10, 10).astype(float)


class BitboardSpaceInvaders(space_invaders.Env):
    """MinAtar's SpaceInvaders ``Env`` with its three grids (aliens, the cannon's bullets, the
    aliens' bullets) held as Python integers, one bit a cell: a step is a few integer shifts and
    masks instead of numpy calls on 10x10 arrays. The rules, their order and the observations are
    MinAtar's; ``alien_map``, ``f_bullet_map`` and ``e_bullet_map`` read as MinAtar's arrays."""

    def reset(self):
        self.pos = 5
        self.f_bullets = 0
        self.e_bullets = 0
        self.aliens = _WAVE
        self.alien_dir = -1
        self.enemy_move_interval = space_invaders.enemy_move_interval
        self.alien_move_timer = self.enemy_move_interval
        self.alien_shot_timer = space_invaders.enemy_shot_interval
        self.ramp_index = 0
        self.shot_timer = 0
        self.terminal = False

    alien_map = property(lambda self: _grid(self.aliens))
    f_bullet_map = property(lambda self: _grid(self.f_bullets))
    e_bullet_map = property(lambda self: _grid(self.e_bullets))

    def act(self, a):
        if self.terminal:
            return 0, True
        action = self.action_map[a]
        cannon = 1 << (90 + self.pos)
        if action == "f" and self.shot_timer == 0:
            self.f_bullets |= cannon
            self.shot_timer = space_invaders.shot_cool_down
        elif action == "l":
            self.pos = max(0, self.pos - 1)
        elif action == "r":
            self.pos = min(9, self.pos + 1)
        cannon = 1 << (90 + self.pos)

        # Bullets move a row a step: the cannon's up and out at the top, the aliens' down and
        # out at the bottom (MinAtar rolls the grid and clears the row that wrapped around).
        self.f_bullets >>= 10
        self.e_bullets = (self.e_bullets << 10) & _FULL
        if self.e_bullets & cannon:
            self.terminal = True

        aliens = self.aliens
        if aliens & cannon:
            self.terminal = True
        if self.alien_move_timer == 0:
            self.alien_move_timer = min(aliens.bit_count(), self.enemy_move_interval)
            if (aliens & _COLUMNS[0] and self.alien_dir < 0) or (
                aliens & _COLUMNS[9] and self.alien_dir > 0
            ):
                self.alien_dir = -self.alien_dir
                if aliens & _BOTTOM_ROW:
                    self.terminal = True
                # Down a row; MinAtar's roll brings the bottom row round to the top.
                aliens = ((aliens << 10) & _FULL) | (aliens >> 90)
            elif self.alien_dir < 0:
                aliens >>= 1  # a column left; the leftmost column is empty here
            else:
                aliens <<= 1  # a column right; the rightmost column is empty here
            if aliens & cannon:
                self.terminal = True
        if self.alien_shot_timer == 0:
            self.alien_shot_timer = space_invaders.enemy_shot_interval
            row, column = self._nearest_alien_bits(aliens, self.pos)
            self.e_bullets |= 1 << (10 * row + column)

        kills = aliens & self.f_bullets
        aliens &= ~kills
        self.f_bullets &= ~kills

        self.shot_timer -= self.shot_timer > 0
        self.alien_move_timer -= 1
        self.alien_shot_timer -= 1
        if not aliens:
            if self.enemy_move_interval > 6 and self.ramping:
                self.enemy_move_interval -= 1
                self.ramp_index += 1
            aliens = _WAVE
        self.aliens = aliens
        return kills.bit_count(), self.terminal

    @staticmethod
    def _nearest_alien_bits(aliens, pos):
        """The lowest alien of the column nearest the cannon that has one (ties: the left one)."""
        for column in sorted(range(10), key=lambda x: abs(x - pos)):
            in_column = aliens & _COLUMNS[column]
            if in_column:
                return (in_column.bit_length() - 1) // 10, column
        return None

    def _nearest_alien(self, pos):
        found = self._nearest_alien_bits(self.aliens, pos)
        return None if found is None else list(found)

    def state(self):
        left, right = (self.aliens, 0) if self.alien_dir < 0 else (0, self.aliens)
        grids = b"".join(
            bits.to_bytes(13, "little")
            for bits in (self.aliens, left, right, self.f_bullets, self.e_bullets)
        )
        cells = np.unpackbits(np.frombuffer(grids, np.uint8), bitorder="little")
        state = np.zeros((10, 10, len(self.channels)), dtype=bool)
        state[:, :, 1:] = cells.reshape(5, 104)[:, :100].reshape(5, 10, 10).transpose(1, 2, 0)
        state[9, self.pos, self.channels["cannon"]] = True
        return state


class OneCallFreeway(freeway.Env):
    """MinAtar's Freeway whose frame (state()) is written by one numpy call: MinAtar's writes
    its 17 cells one numpy index at a time, which took 9 of the 19 microseconds of a Freeway
    env step in the EnvPool worker, the slowest of the five games' (docs/results.md). The
    game itself is MinAtar's."""

    def state(self):
        channels = len(self.channels)
        cells = [(10 * self.pos + 4) * channels + self.channels["chicken"]]
        for x, y, _, speed in self.cars:
            cells.append((10 * y + x) * channels + self.channels["car"])
            back_x = x - 1 if speed > 0 else x + 1
            if back_x < 0:
                back_x = 9
            elif back_x > 9:
                back_x = 0
            # Channels "speed1" to "speed5" follow each other.
            cells.append((10 * y + back_x) * channels + self.channels["speed1"] + abs(speed) - 1)
        state = np.zeros(10 * 10 * channels, dtype=bool)
        state[cells] = True
        return state.reshape(10, 10, channels)


def install():
    """Make MinAtar's Environment build BitboardSpaceInvaders for "space_invaders" and
    OneCallFreeway for "freeway"."""
    space_invaders.Env = BitboardSpaceInvaders
    freeway.Env = OneCallFreeway
