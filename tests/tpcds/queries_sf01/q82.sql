-- TPC-DS q82 with other constants, so that its answer at SF 0.1 has rows
-- (tests/integration/test_tpcds.py; the standard text, tests/tpcds/queries/q82.sql,
-- returns none there).
-- Changed: the manufacturers: 129, 270, 821, 423 -> 842, 373, 303, 383. At SF 0.1 (1,800 items)
-- none of the four has an item priced 62-92 in stock (100-500) in late May to July 2000
-- that a store sold; the new four have among the most such rows.
-- Rows at SF 0.1: 4.
SELECT i_item_id ,
       i_item_desc ,
       i_current_price
FROM item,
     inventory,
     date_dim,
     store_sales
WHERE i_current_price BETWEEN 62 AND 62+30
  AND inv_item_sk = i_item_sk
  AND d_date_sk=inv_date_sk
  AND d_date BETWEEN cast('2000-05-25' AS date) AND cast('2000-07-24' AS date)
  AND i_manufact_id IN (842,
                        373,
                        303,
                        383)
  AND inv_quantity_on_hand BETWEEN 100 AND 500
  AND ss_item_sk = i_item_sk
GROUP BY i_item_id,
         i_item_desc,
         i_current_price
ORDER BY i_item_id
LIMIT 100;
